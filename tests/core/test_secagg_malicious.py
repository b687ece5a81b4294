"""The malicious-server variant of secure sums: signed keys and the survivor-set check."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.secagg import (SHARE_BYTES, array_to_bytes, bytes_to_array, open_sealed,
                                  x25519_keypair)
from fedclust.core.secure_sum_device import secure_sum_client
from fedclust.core.secure_sum import (SIGNED_STAGES, STAGES, SecureAggregation,
                                      SecureSumServer, make_identities)

SIGNED = SecureAggregation(signed=True)


def _values(n, seed=0):
    rng = np.random.default_rng(seed)
    return {z: {"sums": rng.normal(scale=20.0, size=(2, 3)),
                "counts": rng.integers(0, 50, size=2).astype(np.int64)} for z in range(n)}


def run(values, settings, *, identities=None, lie=None, drop_after_mask=()):
    """Every stage in memory; ``lie(stage, z, inbound) -> inbound`` is the server lying."""
    ids = sorted(values)
    srv = SecureSumServer(ids, round_id=5, settings=settings, seed=1)
    states = {z: {} for z in ids}
    for stage in srv.stages:
        replies = {}
        for z, inbound in srv.requests(stage).items():
            if lie is not None:
                inbound = lie(stage, z, dict(inbound))
            rep = secure_sum_client(stage, inbound, states[z], device_id=z,
                                    reply=values[z] if stage == "mask" else None,
                                    identity=(identities or {}).get(z))
            if stage == "mask" and z in drop_after_mask:
                continue
            replies[z] = rep
        srv.take(stage, replies)
    return srv


def test_signed_sum_equals_the_plain_one_with_a_third_dropping():
    vals = _values(9)
    idn = make_identities(range(9))
    srv = run(vals, SIGNED, identities=idn, drop_after_mask=(2, 5, 7))
    assert srv.stages == SIGNED_STAGES and len(STAGES) == 4
    assert srv.survivors == [0, 1, 3, 4, 6, 8]
    got = srv.result()
    want = sum(vals[z]["sums"] for z in srv.survivors)
    np.testing.assert_allclose(got["sums"], want, atol=9 * 2.0 ** -21, rtol=0)
    np.testing.assert_array_equal(got["counts"], sum(vals[z]["counts"] for z in srv.survivors))


def test_a_device_without_the_checks_refuses_nothing_a_signed_one_refuses_a_skipped_check():
    vals = _values(4)
    idn = make_identities(range(4))
    with pytest.raises(ValidationError, match="no signature of its keys|without their signatures"):
        # the server asks the devices to run unsigned: they sign anyway, and a peer
        # given keys without signatures refuses to share
        def strip(stage, z, inbound):
            inbound.pop("sig", None)
            return inbound
        run(vals, SIGNED, identities=idn, lie=strip)
    with pytest.raises(ValidationError, match="stage .unmask. out of order .*it follows .confirm."):
        # an identity-holding device asked to unmask without the confirm stage
        srv = SecureSumServer(range(4), 5, SIGNED, 1)
        srv.stages = STAGES  # a server skipping the consistency check
        states = {z: {} for z in range(4)}
        for stage in STAGES:
            replies = {z: secure_sum_client(stage, m, states[z], device_id=z, identity=idn[z],
                                            reply=vals[z] if stage == "mask" else None)
                       for z, m in srv.requests(stage).items()}
            srv.take(stage, replies)


def _swap_keys(server_c_pk):
    """The server puts its own share-encryption key in place of device 1's, for device 0."""
    def lie(stage, z, inbound):
        if stage == "share" and z == 0:
            c = inbound["c_pk"].copy()
            c[list(inbound["ids"]).index(1)] = bytes_to_array(server_c_pk)
            inbound["c_pk"] = c
        return inbound
    return lie


def test_forged_key_advertisement_leaks_shares_unless_signed():
    vals = _values(4)
    s_sk, s_pk = x25519_keypair()
    seen = {}

    class Eavesdrop(SecureSumServer):
        def _take_share(self, z, rep):
            if z == 0:
                seen.update(zip(np.asarray(rep["dst"]).tolist(), rep["ct"]))
            super()._take_share(z, rep)

    # unsigned: device 0 encrypts its shares for "device 1" under the server's key ...
    srv = Eavesdrop(range(4), 5, SecureAggregation(), 1)
    states = {z: {} for z in range(4)}
    lie = _swap_keys(s_pk)
    for stage in ("keys", "share"):
        replies = {z: secure_sum_client(stage, lie(stage, z, dict(m)), states[z], device_id=z)
                   for z, m in srv.requests(stage).items()}
        srv.take(stage, replies)
    c0 = srv.keys[0][0]
    plain = open_sealed(s_sk, c0, 0, 1, 5, array_to_bytes(seen[1]))  # ... so it reads them
    assert len(plain) == 2 * SHARE_BYTES
    # signed: device 0 checks device 1's keys against its identity key and refuses
    with pytest.raises(ValidationError, match="device 0: the keys the server gives for "
                                              "device 1 are not signed"):
        run(vals, SIGNED, identities=make_identities(range(4)), lie=_swap_keys(s_pk))


def _claims(survivors_for):
    """The server names each device its own survivor set (equivocation)."""
    def lie(stage, z, inbound):
        if stage in ("confirm", "unmask") and z in survivors_for:
            inbound["survivors"] = np.asarray(survivors_for[z], np.int64)
            if stage == "unmask":
                inbound["dropped"] = np.asarray(
                    sorted(set(range(6)) - set(survivors_for[z])), np.int64)
        return inbound
    return lie


def test_equivocating_about_the_survivors_is_refused():
    """Device 5 answered, but the server tells devices 0 and 1 that it dropped (to get
    the shares of its mask key) and the others that it survived (its self-mask)."""
    vals = _values(6)
    idn = make_identities(range(6))
    without_5 = [0, 1, 2, 3, 4]
    with pytest.raises(ValidationError, match=r"only 2 of its group signed the survivor set "
                                              r"the server names \(threshold 4\)"):
        run(vals, SIGNED, identities=idn, lie=_claims({0: without_5, 1: without_5}))
    # naming at unmask a set other than the one a device signed
    def switch(stage, z, inbound):
        if stage == "unmask" and z == 3:
            inbound["survivors"] = np.asarray(without_5, np.int64)
            inbound["dropped"] = np.asarray([5], np.int64)
        return inbound
    with pytest.raises(ValidationError, match="device 3: the server now names survivors"):
        run(vals, SIGNED, identities=idn, lie=switch)
    # without identities the devices cannot tell: devices 0 and 1 reveal device 5's
    # mask-key shares although device 5's masked reply is in the server's hands
    revealed = {}

    class Collect(SecureSumServer):
        def _unmask(self, replies, reasons):
            for v, rep in replies.items():
                revealed[v] = dict(zip(np.asarray(rep["ids"]).tolist(),
                                       np.asarray(rep["kind"]).tolist()))
            super()._unmask(replies, reasons)

    srv = Collect(range(6), 5, SecureAggregation(), 1)
    states = {z: {} for z in range(6)}
    lie = _claims({0: without_5, 1: without_5})
    for stage in STAGES:
        replies = {z: secure_sum_client(stage, lie(stage, z, dict(m)), states[z], device_id=z,
                                        reply=vals[z] if stage == "mask" else None)
                   for z, m in srv.requests(stage).items()}
        srv.take(stage, replies)
    assert revealed[0][5] == 1 and revealed[1][5] == 1  # kind 1: a share of 5's mask key
    assert revealed[2][5] == 0                         # kind 0: a share of its self-mask


def test_a_device_signs_one_survivor_set_per_round():
    vals = _values(4)
    idn = make_identities(range(4))
    srv = SecureSumServer(range(4), 5, SIGNED, 1)
    states = {z: {} for z in range(4)}
    for stage in ("keys", "share", "mask", "confirm"):
        replies = {z: secure_sum_client(stage, m, states[z], device_id=z, identity=idn[z],
                                        reply=vals[z] if stage == "mask" else None)
                   for z, m in srv.requests(stage).items()}
        srv.take(stage, replies)
    again = {"round": np.asarray(5), "survivors": np.asarray([0, 1, 2], np.int64)}
    with pytest.raises(ValidationError, match="stage .confirm. already answered in round 5"):
        secure_sum_client("confirm", again, states[0], device_id=0, identity=idn[0])


def test_in_process_transport_runs_the_signed_variant():
    from fedclust.sim.transport import InProcessTransport
    from fedclust.lloyd.protocol import DistributedLloydProtocol

    rng = np.random.default_rng(0)
    devs = {z: rng.normal(size=(30, 3)) + (z % 3) * 4 for z in range(6)}
    p = DistributedLloydProtocol(3, points_per_device=5, max_rounds=3, tol=0.0)
    a = InProcessTransport(secure_aggregation=True).run(p, devs, 2)
    b = InProcessTransport(secure_aggregation=SIGNED, drop_after_masking=[4],
                           on_client_error="drop").run(p, devs, 2)
    c = InProcessTransport(secure_aggregation=SIGNED).run(p, devs, 2)
    np.testing.assert_array_equal(a.result.centers, c.result.centers)
    assert c.meter.secure_exchanges == 4 * 3 and a.meter.secure_exchanges == 3 * 3
    assert sorted(b.log.failed) == [4]


def test_flower_message_api_runs_the_signed_variant_identically():
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport
    from fedclust.lloyd.protocol import DistributedLloydProtocol
    from fedclust.sim.transport import InProcessTransport

    rng = np.random.default_rng(1)
    devs = {z: rng.normal(size=(20, 3)) + (z % 2) * 5 for z in range(4)}
    p = DistributedLloydProtocol(2, points_per_device=5, max_rounds=2, tol=0.0)
    a = InProcessTransport(secure_aggregation=SIGNED).run(p, devs, 3)
    b = FlowerInMemoryTransport(secure_aggregation=SIGNED).run(p, devs, 3)
    np.testing.assert_array_equal(a.result.centers, b.result.centers)
    assert a.meter.summary() == b.meter.summary()


def test_identity_files_round_trip_and_bad_files_are_named(tmp_path):
    from fedclust.core.secagg import sign, verify
    from fedclust.flower.pki import (SECAGG_DIRECTORY, load_secagg_identity,
                                     write_secagg_identities)

    out = write_secagg_identities(tmp_path, [0, 1, 2])
    assert oct(out["private"][0].stat().st_mode & 0o777) == "0o600"
    ids = [load_secagg_identity(tmp_path / f"secagg-{z}.pem", tmp_path / SECAGG_DIRECTORY)
           for z in range(3)]
    assert sorted(ids[0].directory) == [0, 1, 2]
    sig = sign(ids[1].private, b"x")
    assert verify(ids[0].directory[1], sig, b"x") and not verify(ids[0].directory[2], sig, b"x")
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ValidationError, match="bad.pem .* cannot be read"):
        load_secagg_identity(tmp_path / "bad.pem", tmp_path / SECAGG_DIRECTORY)


def test_signed_variant_on_a_sparse_graph_counts_group_signatures():
    vals = _values(12, seed=3)
    settings = SecureAggregation(neighbors=4, signed=True)
    srv = run(vals, settings, identities=make_identities(range(12)), drop_after_mask=(3,))
    assert all(len(g) == 5 for g in srv.group.values())
    got = srv.result()
    np.testing.assert_array_equal(got["counts"], sum(vals[z]["counts"] for z in srv.survivors))
    unmask = srv.requests("unmask")
    assert all(set(m["signers"].tolist()) <= set(srv.group[z]) for z, m in unmask.items())


def test_a_stage_nobody_answers_stops_the_round_with_the_reasons():
    srv = SecureSumServer(range(3), 2, SecureAggregation(), 0)
    with pytest.raises(ValidationError, match="round 2: no device answered stage 'keys' "
                                              r"\(device 0: no handler; device 1: no handler\)"):
        srv.take("keys", {}, {z: f"device {z}: no handler" for z in range(3)})


def test_config_asks_for_the_signed_variant(tmp_path):
    from fedclust.config import ConfigError, check_config
    from fedclust.experiment import make_transport
    from fedclust.flower_app import app_run_config

    base = {"seed": 1, "data": {"source": "gaussians", "n_features": 3, "n_clusters": 2,
                                "n_local_clusters": 1, "m0": 2},
            "algorithm": {"name": "distributed-lloyd", "n_clusters": 2}}
    cfg = check_config({**base, "simulation": {"secure_aggregation": "signed"}})
    assert make_transport(cfg).secure_aggregation == SIGNED
    rc = app_run_config(cfg, result_dir=tmp_path)
    assert rc["secure-aggregation"] is True and rc["secagg-signed"] is True
    plain = app_run_config(check_config({**base, "simulation": {"secure_aggregation": True}}),
                           result_dir=tmp_path)
    assert plain["secagg-signed"] is False
    for bad in ("yes", 1):
        with pytest.raises(ConfigError, match="must be true, false or \"signed\""):
            check_config({**base, "simulation": {"secure_aggregation": bad}})


def test_unmask_counts_only_group_signatures_and_refuses_when_the_server_sends_none():
    vals = _values(5)
    idn = make_identities(range(5))

    def strip(stage, z, inbound):
        if stage == "unmask" and z == 2:
            inbound.pop("signers", None)
            inbound.pop("sigs", None)
        return inbound
    with pytest.raises(ValidationError, match=r"^device 2: only 0 of its group signed the "
                                              r"survivor set the server names \(threshold \d+\); "
                                              r"refusing to reveal shares$"):
        run(vals, SIGNED, identities=idn, lie=strip)

    def stranger(stage, z, inbound):
        # a signer outside the group, with junk: ignored, the group's signatures suffice
        if stage == "unmask":
            inbound["signers"] = np.append(np.asarray(inbound["signers"], np.int64), 99)
            inbound["sigs"] = np.vstack([inbound["sigs"], np.zeros((1, 64), np.uint8)])
        return inbound
    srv = run(vals, SIGNED, identities=idn, lie=stranger)
    np.testing.assert_array_equal(srv.result()["counts"], sum(v["counts"] for v in vals.values()))


def test_an_unknown_stage_is_named_and_a_signed_one_needs_an_identity():
    inbound = {"round": np.asarray(5)}
    with pytest.raises(ValidationError, match=r"^device 3: unknown secure aggregation stage "
                                              r"'confirm' \(or a signed stage without an "
                                              r"identity key\)$"):
        secure_sum_client("confirm", inbound, {}, device_id=3)
    with pytest.raises(ValidationError, match=r"^device 3: unknown secure aggregation stage "
                                              r"'bogus'$"):
        secure_sum_client("bogus", inbound, {}, device_id=3, identity=make_identities([3])[3])


@pytest.mark.parametrize("r", [0, 1, 3])
def test_a_stage_before_the_key_stage_is_refused_by_name(r):
    with pytest.raises(ValidationError, match=rf"^device 1: secure aggregation stage 'share' for "
                                              rf"round {r} without its key stage$"):
        secure_sum_client("share", {"round": np.asarray(r)}, {}, device_id=1)


def test_bad_settings_and_unknown_identities_are_named():
    with pytest.raises(ValidationError, match=r"^secure_aggregation='yes' must be True, False or "
                                              r"a SecureAggregation$"):
        SecureAggregation.coerce("yes")
    assert SecureAggregation.coerce({"signed": True}) == SIGNED
    idn = make_identities([0, 1])[0]
    assert idn.public_of(1, "device 0") == idn.directory[1]
    with pytest.raises(ValidationError, match=r"^device 0: device 7 has no identity key in the "
                                              r"directory; refusing to share secrets with it$"):
        idn.public_of(7, "device 0")
