"""The secure-sum server's own checks: malformed replies rejected by name (the others'
sum still exact), the group graph drawn from the seed and the round, the threshold
checked at the stage where devices drop, and masks that cannot be removed refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.secagg import SHARE_BYTES, PRIME, shamir_split
from fedclust.core.secure_sum import SecureAggregation, SecureSumServer, make_identities
from fedclust.core.secure_sum_device import secure_sum_client

ATOL = 2.0 ** -18


def _values(n, seed=0):
    rng = np.random.default_rng(seed)
    return {z: {"sums": rng.normal(scale=20.0, size=(2, 3)),
                "counts": rng.integers(0, 50, size=2).astype(np.int64)} for z in range(n)}


def drive(values, settings=SecureAggregation(), *, edit=None, identities=None, seed=0):
    """Every stage in memory; ``edit(stage, replies, srv) -> replies`` alters the replies
    the server receives (a device dropping or sending a malformed message)."""
    ids = sorted(values)
    srv = SecureSumServer(ids, round_id=3, settings=settings, seed=seed)
    states = {z: {} for z in ids}
    for stage in srv.stages:
        replies = {z: secure_sum_client(stage, inbound, states[z], device_id=z,
                                        reply=values[z] if stage == "mask" else None,
                                        identity=(identities or {}).get(z))
                   for z, inbound in srv.requests(stage).items()}
        if edit is not None:
            replies = edit(stage, replies, srv)
        srv.take(stage, replies)
    return srv


def _assert_sum_of(srv, values, ids):
    got = srv.result()
    np.testing.assert_array_equal(got["counts"], sum(values[z]["counts"] for z in ids))
    np.testing.assert_allclose(got["sums"], sum(values[z]["sums"] for z in ids), atol=ATOL,
                               rtol=0)


def _at(stage_wanted, z, change):
    def edit(stage, replies, srv):
        if stage == stage_wanted:
            replies[z] = change(dict(replies[z]))
        return replies
    return edit


def test_two_devices_are_enough():
    vals = _values(2, seed=1)
    _assert_sum_of(drive(vals), vals, [0, 1])


def test_the_result_before_unmask_is_refused():
    srv = SecureSumServer([0, 1, 2], round_id=0, settings=SecureAggregation(), seed=0)
    with pytest.raises(ValidationError, match=r"^secure sum not complete: run the 'unmask' "
                                              r"stage first$"):
        srv.result()


@pytest.mark.parametrize("n,k,size", [(10, 8, 9), (10, 3, 5), (12, 4, 5), (9, 8, 9), (9, 7, 9)])
def test_a_device_group_holds_the_ring_neighbours_within_k_over_two(n, k, size):
    srv = SecureSumServer(list(range(n)), round_id=1, settings=SecureAggregation(neighbors=k),
                          seed=0)
    assert all(len(g) == size and z in g for z, g in srv.group.items())


def test_the_group_graph_follows_the_seed_and_the_round():
    def groups(seed, round_id):
        return SecureSumServer(list(range(30)), round_id=round_id,
                               settings=SecureAggregation(neighbors=4), seed=seed).group
    assert groups(7, 2) == groups(7, 2)           # reproducible from the seed
    assert groups(7, 2) != groups(8, 2)           # drawn from it
    assert groups(7, 2) != groups(7, 3)           # a fresh graph each round


def _missing(field):
    def change(rep):
        del rep[field]
        return rep
    return change


@pytest.mark.parametrize("stage,change,why", [
    ("keys", _missing("c_pk"), "device 2: bad secure aggregation 'keys' reply ('c_pk')"),
    ("keys", lambda r: {**r, "c_pk": r["c_pk"][:31]}, "device 2: public keys must be 32 uint8 each"),
    ("keys", lambda r: {**r, "s_pk": r["s_pk"][:31]}, "device 2: public keys must be 32 uint8 each"),
    ("keys", lambda r: {**r, "c_pk": r["c_pk"].astype(np.int64)},
     "device 2: public keys must be 32 uint8 each"),
    ("share", lambda r: {**r, "ct": r["ct"][:-1]}, "device 2: shares for"),
    ("share", lambda r: {**r, "ct": r["ct"].astype(np.int64)}, "device 2: shares for"),
    ("share", lambda r: {**r, "dst": r["dst"][:-1], "ct": r["ct"][:-1]}, "device 2: shares for"),
    ("mask", lambda r: {**r, "y": r["y"].astype(np.float64)},
     "device 2: masked reply must be a uint64 vector"),
    ("mask", lambda r: {**r, "y": r["y"][:-1]}, "device 2: reply fields/shapes"),
])
def test_a_malformed_reply_is_rejected_by_name_and_the_others_are_summed(stage, change, why):
    vals = _values(6, seed=2)
    srv = drive(vals, edit=_at(stage, 2, change))
    assert set(srv.rejected) == {2}
    assert srv.rejected[2] == why if why.endswith(("each", "')", "vector")) \
        else srv.rejected[2].startswith(why)
    # rejected before masking: absent; rejected at masking: its masks are removed
    _assert_sum_of(srv, vals, [0, 1, 3, 4, 5])


def test_a_mask_reply_without_bad_sources_or_naming_a_stranger_blames_nobody():
    vals = _values(6, seed=3)

    def edit(stage, replies, srv):
        if stage == "mask":
            del replies[0]["bad_src"]                       # an older or terse device
            replies[1]["bad_src"] = np.asarray([99], np.int64)   # no such device
        return replies
    srv = drive(vals, edit=edit)
    assert srv.rejected == {} and srv.failed == {}
    _assert_sum_of(srv, vals, range(6))


def test_signatures_of_the_wrong_shape_are_refused_at_keys_and_not_kept_at_confirm():
    vals = _values(6, seed=4)
    idn = make_identities(range(6))
    settings = SecureAggregation(signed=True)
    srv = drive(vals, settings, identities=idn,
                edit=_at("keys", 4, lambda r: {**r, "sig": r["sig"][:10]}))
    assert srv.rejected == {4: "device 4: no signature of its keys (64 uint8)"}
    _assert_sum_of(srv, vals, [0, 1, 2, 3, 5])

    srv = drive(vals, settings, identities=idn,
                edit=_at("confirm", 3, lambda r: {**r, "sig": r["sig"][:10]}))
    assert sorted(srv.confirms) == [0, 1, 2, 4, 5]
    _assert_sum_of(srv, vals, range(6))


def test_too_many_dropping_at_keys_stops_there():
    def edit(stage, replies, srv):
        return {z: r for z, r in replies.items() if z > 2} if stage == "keys" else replies
    with pytest.raises(ValidationError, match=r"after stage 'keys' only 3 of the 6 devices "
                                              r"holding device 3's shares remain \(threshold 4\)"):
        drive(_values(6, seed=5), edit=edit)


def test_a_dropped_device_whose_shares_are_lost_stops_the_round_at_mask():
    # ring groups of 3 (threshold 2): device u and one neighbour drop after sharing;
    # every survivor's group keeps 2, but u's pair masks could no longer be removed
    def edit(stage, replies, srv):
        if stage == "mask":
            u = 4
            w = next(v for v in srv.group[u] if v != u)
            return {z: r for z, r in replies.items() if z not in (u, w)}
        return replies
    with pytest.raises(ValidationError, match=r"after stage 'mask' only 1 of the 3 devices "
                                              r"holding device \d's shares remain"):
        drive(_values(10, seed=6), SecureAggregation(neighbors=2), edit=edit)


def test_masks_without_enough_revealed_shares_are_refused_by_name():
    vals = _values(5, seed=7)
    with pytest.raises(ValidationError, match=r"round 3: device 0's self-mask cannot be removed: "
                                              r"0 shares revealed, threshold 4"):
        drive(vals, edit=lambda stage, replies, srv: {} if stage == "unmask" else replies)

    def no_key_shares(stage, replies, srv):
        if stage == "mask":
            del replies[1]                   # dropped after sharing: its mask key is needed
        if stage == "unmask":
            for r in replies.values():
                keep = np.asarray(r["kind"]) == 0
                r.update(ids=r["ids"][keep], kind=r["kind"][keep], share=r["share"][keep])
        return replies
    with pytest.raises(ValidationError, match=r"round 3: device 1's mask key cannot be removed: "
                                              r"0 shares revealed, threshold 4"):
        drive(vals, edit=no_key_shares)


def _replace_shares(replies, srv, u, kind, ys):
    for v, r in replies.items():
        hit = (np.asarray(r["ids"]) == u) & (np.asarray(r["kind"]) == kind)
        for i in np.flatnonzero(hit):
            r["share"][i] = np.frombuffer(ys[srv.pos[v] + 1].to_bytes(SHARE_BYTES, "big"),
                                          np.uint8)


def test_shares_of_a_secret_beyond_256_bits_are_refused():
    vals = _values(4, seed=8)
    xs = [1, 2, 3, 4]

    def edit(stage, replies, srv):
        if stage == "unmask":
            secret = (1 << 256).to_bytes(33, "big")      # consistent, but no 32-byte seed
            ys = dict(zip(xs, shamir_split(secret, xs, srv.threshold[0])))
            _replace_shares(replies, srv, 0, 0, ys)
        return replies
    assert (1 << 256) < PRIME
    with pytest.raises(ValidationError, match=r"device 0's self-mask cannot be removed: the "
                                              r"shares do not belong to one secret"):
        drive(vals, edit=edit)


def test_a_share_from_outside_the_group_is_ignored():
    vals = _values(10, seed=9)
    bystander = {}

    def edit(stage, replies, srv):
        if stage == "unmask":
            u = 0
            v = next(v for v in srv.survivors if v not in srv.group[u])
            bystander["v"] = v
            r = replies[v]   # v claims to hold a share of u's self-mask: garbage
            r.update(ids=np.append(r["ids"], u), kind=np.append(r["kind"], np.uint8(0)),
                     share=np.vstack([r["share"], np.full((1, SHARE_BYTES), 7, np.uint8)]))
        return replies
    srv = drive(vals, SecureAggregation(neighbors=4), edit=edit)
    assert bystander["v"] not in srv.distrusted and srv.distrusted == {}
    _assert_sum_of(srv, vals, range(10))
