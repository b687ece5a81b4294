"""A device's own refusals in a secure sum, against a server that deviates: a group
that repeats a member, a survivor set that leaves the device out; and a device that
keeps every authentic share after one that fails authentication."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.secure_sum import SecureAggregation, SecureSumServer, make_identities
from fedclust.core.secure_sum_device import secure_sum_client


def _values(n, seed=0):
    rng = np.random.default_rng(seed)
    return {z: {"sums": rng.normal(scale=20.0, size=(2, 3)),
                "counts": rng.integers(0, 50, size=2).astype(np.int64)} for z in range(n)}


def _until(stage_wanted, n, settings=SecureAggregation(), identities=None):
    """Runs the stages before ``stage_wanted``; returns (server, device states, requests)."""
    vals = _values(n)
    srv = SecureSumServer(list(range(n)), round_id=2, settings=settings, seed=0)
    states = {z: {} for z in range(n)}
    for stage in srv.stages:
        reqs = srv.requests(stage)
        if stage == stage_wanted:
            return srv, states, reqs
        srv.take(stage, {z: secure_sum_client(stage, inbound, states[z], device_id=z,
                                              reply=vals[z] if stage == "mask" else None,
                                              identity=(identities or {}).get(z))
                         for z, inbound in reqs.items()})
    raise AssertionError(stage_wanted)


def test_a_group_that_repeats_a_member_is_refused():
    srv, states, reqs = _until("share", 5)
    inbound = dict(reqs[0])
    # member 4 replaced by a second copy of member 3: same lengths, one device twice
    for f in ("ids", "x", "c_pk", "s_pk"):
        a = np.array(inbound[f])
        a[-1] = a[-2]
        inbound[f] = a
    with pytest.raises(ValidationError, match=r"^device 0: the group the server gives \(5 ids\) "
                                              r"leaves out this device or repeats a member"):
        secure_sum_client("share", inbound, states[0], device_id=0)


def test_a_signed_device_does_not_sign_a_survivor_set_without_it():
    idn = make_identities(range(5))
    srv, states, reqs = _until("confirm", 5, SecureAggregation(signed=True), idn)
    inbound = dict(reqs[2])
    inbound["survivors"] = np.asarray([0, 1, 3, 4], np.int64)   # enough, but not device 2
    with pytest.raises(ValidationError, match=r"^device 2: the survivor set \[0, 1, 3, 4\] leaves "
                                              r"out this device"):
        secure_sum_client("confirm", inbound, states[2], device_id=2, identity=idn[2])


def test_shares_after_a_forged_one_are_still_kept():
    # device 3 receives a forged share from device 1 before the others' shares: it keeps
    # and later reveals every authentic one (the sum would survive a few missing ones)
    n, z = 7, 3
    vals = _values(n, seed=1)
    srv = SecureSumServer(list(range(n)), round_id=2, settings=SecureAggregation(), seed=0)
    states = {v: {} for v in range(n)}
    revealed = {}
    for stage in srv.stages:
        replies = {}
        for v, inbound in srv.requests(stage).items():
            if stage == "mask" and v == z:
                inbound = dict(inbound)
                src = inbound["src"].tolist()
                assert src.index(1) < len(src) - 1
                ct = inbound["ct"].copy()
                ct[src.index(1), 0] ^= 1
                inbound["ct"] = ct
            replies[v] = secure_sum_client(stage, inbound, states[v], device_id=v,
                                           reply=vals[v] if stage == "mask" else None)
        if stage == "unmask":
            revealed = replies[z]
        srv.take(stage, replies)
    survivors = [v for v in range(n) if v != 1]
    assert list(srv.rejected) == [1] and srv.survivors == survivors
    assert sorted(revealed["ids"][revealed["kind"] == 0].tolist()) == survivors
    assert 1 not in revealed["ids"].tolist()          # its forged share is not revealed
    got = srv.result()
    np.testing.assert_array_equal(got["counts"], sum(vals[v]["counts"] for v in survivors))
    np.testing.assert_allclose(got["sums"], sum(vals[v]["sums"] for v in survivors),
                               atol=2.0 ** -18, rtol=0)
