"""A deviating server against the secure-sum devices: every attack is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from harness import drive, values

from fedclust.core.exceptions import ValidationError
from fedclust.core.secagg import (SHARE_BYTES, array_to_bytes, decode_fixed, prg_mask,
                                  shamir_combine, shamir_decode, shamir_split)
from fedclust.core.secure_sum_device import secure_sum_client
from fedclust.core.secure_sum import (SecureAggregation, SecureSumServer, make_identities)

PLAIN = SecureAggregation()
SIGNED = SecureAggregation(signed=True)


def _alone(stage, z, inbound):
    """Finding 1: the server tells device 0 that its group is {0} with threshold 1."""
    if z == 0 and stage == "share":
        i = list(np.asarray(inbound["ids"])).index(0)
        for key in ("ids", "x", "c_pk", "s_pk", "sig"):
            if key in inbound:
                inbound[key] = inbound[key][i:i + 1]
        inbound["threshold"] = np.asarray(1, np.int64)
    if z == 0 and stage == "mask":
        inbound.update(src=np.zeros(0, np.int64), ct=np.zeros((0, 0), np.uint8),
                       peers=np.zeros(0, np.int64))
    return inbound


def _recover_alone(settings, identities=None):
    """The attack itself: device 0 alone, its own share of its self-mask unmasks it."""
    vals = values(4)
    srv = SecureSumServer(range(4), 5, settings, 1)
    state = {}
    idn = (identities or {}).get(0)
    y = None
    for stage in srv.stages:
        inbound = _alone(stage, 0, dict(srv.requests(stage)[0]) if stage in ("keys", "share")
                         else {"round": np.asarray(5)})
        if stage == "share":
            pass
        elif stage == "mask":
            inbound = _alone(stage, 0, inbound)
        elif stage in ("confirm", "unmask"):
            inbound.update(survivors=np.asarray([0]), dropped=np.zeros(0, np.int64))
            if stage == "unmask" and idn is not None:
                inbound.update(signers=np.asarray([0]), sigs=confirm_sig[None])
        rep = secure_sum_client(stage, inbound, state, device_id=0, identity=idn,
                                reply=vals[0] if stage == "mask" else None)
        if stage == "keys":
            srv.take("keys", {z: (rep if z == 0 else secure_sum_client(
                "keys", m, {}, device_id=z, identity=(identities or {}).get(z)))
                for z, m in srv.requests("keys").items()})
        if stage == "mask":
            y, layout = rep["y"], array_to_bytes(rep["layout"]).decode()
        if stage == "confirm":
            confirm_sig = rep["sig"]
        if stage == "unmask":
            b = shamir_combine({1: int.from_bytes(array_to_bytes(rep["share"][0]), "big")}, 1)
            return vals[0], decode_fixed(y - prg_mask(b, y.size), layout, 20)


@pytest.mark.parametrize("settings", [PLAIN, SIGNED], ids=["honest-but-curious", "signed"])
def test_finding1_a_group_of_one_is_refused(settings):
    idn = make_identities(range(4)) if settings.signed else None
    with pytest.raises(ValidationError, match=r"device 0: .*group of 1 device.*minimum 2"):
        _recover_alone(settings, idn)


def test_finding1_the_threshold_is_the_devices_own():
    """The server says t=1 for the full group: a single colluding peer would then hold
    device 0's whole self-mask seed. The device ignores the server's t."""
    def low_t(stage, z, inbound):
        if stage == "share":
            inbound["threshold"] = np.asarray(1, np.int64)
        return inbound

    srv, states = drive(values(6), PLAIN, lie=low_t, stages=("keys", "share", "mask"))
    held = dict(zip(states[1]["secagg.held_ids"].tolist(), states[1]["secagg.held"]))
    one = int.from_bytes(array_to_bytes(held[0][SHARE_BYTES:]), "big")
    b0 = int.from_bytes(array_to_bytes(states[0]["secagg.b"]), "big")
    assert shamir_decode({srv.pos[1] + 1: one}, 1)[0] != b0  # one share says nothing of b
    assert int(states[0]["secagg.threshold"]) == 4  # 6 - 6 // 3, computed on the device


def _to_mask(n=4):
    vals = values(n)
    srv, states = drive(vals, PLAIN, stages=("keys", "share"))
    return vals, srv, states, srv.requests("mask")


def test_finding2_mask_twice_is_refused():
    vals, srv, states, inbound = _to_mask()
    first = secure_sum_client("mask", inbound[0], states[0], device_id=0, reply=vals[0])
    other = {k: v * 0 for k, v in vals[0].items()}
    with pytest.raises(ValidationError, match=r"device 0: .*'mask' .*already .*round 5"):
        second = secure_sum_client("mask", inbound[0], states[0], device_id=0, reply=other)
        # what the server would get: the exact reply
        assert not np.array_equal(first["y"] - second["y"], first["y"])


def test_finding2_share_twice_is_refused_no_nonce_reuse():
    vals = values(4)
    srv, states = drive(vals, PLAIN, stages=("keys", "share"))
    with pytest.raises(ValidationError, match=r"device 2: .*'share' .*already .*round 5"):
        secure_sum_client("share", srv.requests("share")[2], states[2], device_id=2)


@pytest.mark.parametrize("order", [("keys", "mask"), ("keys", "unmask"),
                                   ("keys", "share", "unmask"), ("keys", "keys")])
def test_out_of_order_stages_are_refused(order):
    vals = values(4)
    srv = SecureSumServer(range(4), 5, PLAIN, 1)
    state = {}
    msgs = {"keys": srv.requests("keys")[0]}
    with pytest.raises(ValidationError, match=r"device 0: secure aggregation stage"):
        for stage in order:
            inbound = msgs.get(stage, {"round": np.asarray(5), "survivors": np.arange(4),
                                       "dropped": np.zeros(0, np.int64),
                                       "src": np.zeros(0, np.int64),
                                       "ct": np.zeros((0, 0), np.uint8),
                                       "peers": np.arange(1, 4)})
            if stage == "share":
                srv.take("keys", {z: secure_sum_client("keys", m, {} if z else state,
                                                       device_id=z)
                                  for z, m in srv.requests("keys").items()})
                inbound = srv.requests("share")[0]
            secure_sum_client(stage, inbound, state, device_id=0, reply=vals[0])


def test_a_finished_round_is_not_keyed_again():
    vals = values(4)
    _, states = drive(vals, PLAIN, round_id=7)
    keys = {"frac_bits": np.asarray(20), "n_devices": np.asarray(4)}
    with pytest.raises(ValidationError, match=r"device 0: secure aggregation stage 'keys' "
                                              r"already answered in round 7"):
        secure_sum_client("keys", dict(keys, round=np.asarray(7)), states[0], device_id=0)
    # another protocol phase (another action) may number its rounds from 0 again
    secure_sum_client("keys", dict(keys, round=np.asarray(0)), states[0], device_id=0,
                      action="lloyd")
    # with two rounds keyed, each is still refused, by its own name
    with pytest.raises(ValidationError, match=r"^device 0: secure aggregation stage 'keys' "
                                              r"already answered in round 0 \(lloyd\); refusing "
                                              r"to answer it again$"):
        secure_sum_client("keys", dict(keys, round=np.asarray(0)), states[0], device_id=0,
                          action="lloyd")
    with pytest.raises(ValidationError, match=r"^device 0: secure aggregation stage 'keys' "
                                              r"already answered in round 7; refusing to "
                                              r"answer it again$"):
        secure_sum_client("keys", dict(keys, round=np.asarray(7)), states[0], device_id=0)
    with pytest.raises(ValidationError, match=r"device 0: secure aggregation stage 'share' of "
                                              r"round 0 for another action"):
        secure_sum_client("share", {"round": np.asarray(0)}, states[0], device_id=0,
                          action="moments")


def test_shamir_checks_the_extra_shares_and_names_the_bad_one():
    secret = bytes(range(32))
    xs = list(range(1, 8))
    ys = shamir_split(secret, xs, 3)
    good = dict(zip(xs, ys))
    assert shamir_combine(good, 3) == secret
    for bad_x in (1, 5):  # among the first t, and an extra one
        pts = dict(good)
        pts[bad_x] = (pts[bad_x] + 12345) % (1 << 521)
        with pytest.raises(ValidationError) as err:
            shamir_combine(pts, 3, strict=True)
        assert err.value.bad == [bad_x]
        assert shamir_combine(pts, 3) == secret  # within the error-correcting capacity
    pts = dict(good)
    for x in (1, 2, 3):
        pts[x] += 1
    with pytest.raises(ValidationError, match="inconsistent"):
        shamir_combine(pts, 3)


def test_a_bad_revealed_share_is_named_and_the_sum_stays_exact():
    vals = values(7)

    def corrupt(stage, z, inbound):
        return inbound

    class Lying(SecureSumServer):
        pass

    ids = list(range(7))
    srv = SecureSumServer(ids, 5, PLAIN, 1)
    states = {z: {} for z in ids}
    for stage in srv.stages:
        replies = {z: secure_sum_client(stage, m, states[z], device_id=z,
                                        reply=vals[z] if stage == "mask" else None)
                   for z, m in srv.requests(stage).items()}
        if stage == "unmask":
            sh = replies[3]["share"].copy()
            sh[0, -1] ^= 1  # device 3 reveals one wrong share
            replies[3] = dict(replies[3], share=sh)
        srv.take(stage, replies)
    got = srv.result()
    np.testing.assert_array_equal(got["counts"], sum(vals[z]["counts"] for z in ids))
    assert 3 in srv.distrusted and "inconsistent" in srv.distrusted[3] and not srv.rejected


def test_errors_that_reach_the_server_carry_no_data_values():
    from fedclust.core.secagg import encode_fixed

    secret = 987654321.123e5
    with pytest.raises(ValidationError) as err:
        encode_fixed({"sums": np.array([1.0, -secret])}, 20, 10, sender="device 4")
    text = str(err.value)
    assert text.startswith("device 4: field 'sums' has a value too large")
    assert "987" not in text and "9.87" not in text and "limit" in text


def _lie_at_share(change):
    def lie(stage, z, inbound):
        if stage == "share" and z == 0:
            change(inbound)
        return inbound
    return lie


@pytest.mark.parametrize("change, message", [
    # share point 0 would make a peer's share the secret itself
    (lambda m: m.__setitem__("x", np.where(np.arange(len(m["x"])) == 1, 0, m["x"])),
     "share points must be distinct and non-zero"),
    (lambda m: m.__setitem__("x", np.full(len(m["x"]), 3)),
     "share points must be distinct and non-zero"),
    (lambda m: m.__setitem__("ids", np.asarray([1, 1, 2, 3])),
     "device 0: the group the server gives .* leaves out this device or repeats a member"),
    (lambda m: m.__setitem__("ids", np.asarray([4, 1, 2, 3])),
     "device 0: the group the server gives .* leaves out this device or repeats a member"),
], ids=["x-zero", "x-repeated", "member-twice", "not-in-group"])
def test_a_forged_group_or_share_points_are_refused(change, message):
    with pytest.raises(ValidationError, match=message):
        drive(values(4), PLAIN, lie=_lie_at_share(change), stages=("keys", "share"))


def test_masking_with_a_device_outside_the_group_is_refused():
    def lie(stage, z, inbound):
        if stage == "mask" and z == 0:
            inbound["peers"] = np.asarray([1, 2, 3, 9], np.int64)
        return inbound

    with pytest.raises(ValidationError, match="device 0: asked to mask with device 9, not in "
                                              "its group"):
        drive(values(4), PLAIN, lie=lie, stages=("keys", "share", "mask"))


def test_a_device_with_an_identity_refuses_unsigned_peers_and_a_skipped_confirm():
    idn = make_identities(range(4))
    srv, states = drive(values(4), SIGNED, identities=idn, stages=("keys", "share", "mask"))
    unmask = {"round": np.asarray(5), "survivors": np.arange(4), "dropped": np.zeros(0, int)}
    with pytest.raises(ValidationError, match=r"device 2: secure aggregation stage 'unmask' out "
                                              r"of order .*it follows 'confirm'"):
        secure_sum_client("unmask", unmask, states[2], device_id=2, identity=idn[2])


def test_reconstruction_names_exactly_the_wrong_shares_within_capacity():
    """Every (n, t) up to 9 shares, every number of wrong shares Reed-Solomon can correct:
    the secret comes back and exactly the altered points are named."""
    rng = np.random.default_rng(3)
    for t in range(1, 5):
        for n in range(t, t + 6):
            secret = rng.bytes(32)
            xs = [int(x) for x in rng.choice(np.arange(1, 1000), n, replace=False)]
            good = dict(zip(xs, shamir_split(secret, xs, t)))
            for n_bad in range(0, (n - t) // 2 + 1):
                bad = sorted(int(x) for x in rng.choice(xs, n_bad, replace=False))
                pts = {x: (y + 1 + int(rng.integers(1 << 60))) if x in bad else y
                       for x, y in good.items()}
                s, named = shamir_decode(pts, t)
                assert s.to_bytes(32, "big") == secret and named == bad, (n, t, bad)
