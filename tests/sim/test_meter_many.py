"""The byte meter's batch records equal the one-by-one records (repeats and order included)."""

from fedclust.sim.meter import CommunicationMeter


def test_record_many_equals_record_one_by_one():
    batches = [([3, 1, 2], 40), ([5, 5, 1], 7), (range(4), 3), ([], 9), ([8, 8], 2)]
    many, single = CommunicationMeter(), CommunicationMeter()
    for ids, n in batches:
        many.record_up_many(ids, n)
        many.record_down_many(ids, n + 1)
        for z in ids:
            single.record_up(z, n)
            single.record_down(z, n + 1)
    assert dict(many.up) == dict(single.up) == {3: 43, 1: 50, 2: 43, 5: 14, 0: 3, 8: 4}
    assert dict(many.down) == dict(single.down)
    assert many.messages_up == single.messages_up == 12
    assert many.summary() == single.summary()
    assert list(many.summary()["per_device"]) == ["0", "1", "2", "3", "5", "8"]


def test_per_device_lists_devices_with_traffic_in_one_direction_only():
    m = CommunicationMeter()
    m.record_up_many([2], 10)
    m.record_down_many([1], 4)
    assert m.summary()["per_device"] == {"1": {"up": 0, "down": 4}, "2": {"up": 10, "down": 0}}
