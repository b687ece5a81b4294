"""A site run's log names a failed device by its site."""

from fedclust.core.protocol import RunLog


def test_reasons_name_the_site_in_place_of_the_device():
    log = RunLog(failed={1: "device 1: no reply within 5 s (timed out)",
                         12: "device 12 (final message): client error",
                         3: "disk on fire"},
                 rejected={2: "device 2: reply has no fedclust_reply array record"})
    names = ["a", "b", "c", "device 3"] + [f"s{i}" for i in range(4, 13)]
    log.name_sites(names)
    log.name_sites(names)  # a second call changes nothing
    assert log.failed == {1: "site 'b' (device 1): no reply within 5 s (timed out)",
                          12: "site 's12' (device 12) (final message): client error",
                          3: "disk on fire"}  # a site whose name the server never learnt
    assert log.rejected == {2: "site 'c' (device 2): reply has no fedclust_reply array record"}


def test_a_reason_without_the_device_prefix_gets_the_site_in_front():
    log = RunLog(failed={0: "policy refused action 'x'", 1: "device 10 is not this one"})
    log.name_sites(["h0", "h1"])
    assert log.failed == {0: "site 'h0' (device 0): policy refused action 'x'",
                          1: "site 'h1' (device 1): device 10 is not this one"}


def test_a_warnings_list_of_devices_names_the_sites():
    big, other = 1_837_465_112, 99
    log = RunLog(warnings=[f"k-FED: 80% of the points ...; devices 3, {big}, ...): poorly",
                           f"devices 3, {other}: one of them has no name",
                           "robust: cluster 0 got no valid update"])
    log.name_sites({3: "hospital_a", big: "hospital_b"})
    log.name_sites({3: "hospital_a", big: "hospital_b"})  # a second call changes nothing
    assert log.warnings == ["k-FED: 80% of the points ...; sites 'hospital_a', "
                            "'hospital_b', ...): poorly",
                            f"devices 3, {other}: one of them has no name",
                            "robust: cluster 0 got no valid update"]
