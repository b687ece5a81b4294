"""Secure sums: masking/unmasking against plaintext sums, dropouts, Shamir thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.secagg import (PRIME, decode_fixed, encode_fixed, open_sealed, prg_mask, seal,
                                  shamir_combine, shamir_split, x25519_keypair)
from fedclust.core.secure_sum import SecureAggregation, SecureSumServer
from fedclust.core.secure_sum_device import secure_sum_client


def _entropy(seed):
    rng = np.random.default_rng(seed)
    return lambda n: rng.bytes(n)


def run_sum(values, *, settings=SecureAggregation(), drop_after_mask=(), drop_at_keys=(),
            seed=0, entropy=None, tamper_ct=None):
    """All four stages over in-memory devices; returns (server, masked replies seen)."""
    ids = sorted(values)
    srv = SecureSumServer(ids, round_id=3, settings=settings, seed=seed)
    states = {z: {} for z in ids}
    seen = {}
    for stage in ("keys", "share", "mask", "unmask"):
        reqs = srv.requests(stage)
        replies = {}
        for z, inbound in reqs.items():
            if stage == "keys" and z in drop_at_keys:
                continue
            if stage == "mask" and tamper_ct is not None:
                inbound = tamper_ct(z, inbound)
            rep = secure_sum_client(stage, inbound, states[z], device_id=z,
                                    reply=values[z] if stage == "mask" else None,
                                    entropy=entropy(z, stage) if entropy else None)
            if stage == "mask":
                seen[z] = rep["y"].copy()
                if z in drop_after_mask:
                    continue  # masked, then gone
            replies[z] = rep
        srv.take(stage, replies)
    return srv, seen


def _values(n, seed=0, k=3, d=4):
    rng = np.random.default_rng(seed)
    return {z: {"sums": rng.normal(scale=50.0, size=(k, d)),
                "counts": rng.integers(0, 1000, size=k).astype(np.int64),
                "cost": np.asarray(rng.uniform(0, 1e3))} for z in range(n)}


def _plain_sum(values, ids):
    return {f: sum(values[z][f] for z in ids) for f in values[ids[0]]}


@pytest.mark.parametrize("n", [3, 7, 12])
def test_sum_equals_plaintext_within_fixed_point(n):
    vals = _values(n, seed=n)
    srv, _ = run_sum(vals)
    got, ref = srv.result(), _plain_sum(vals, list(range(n)))
    tol = n * 2.0 ** -(20 + 1)
    assert np.abs(got["sums"] - ref["sums"]).max() <= tol
    assert abs(float(got["cost"]) - float(ref["cost"])) <= tol
    assert np.array_equal(got["counts"], ref["counts"]) and got["counts"].dtype == np.int64
    assert srv.survivors == list(range(n)) and srv.dropped == []


@pytest.mark.parametrize("n,drop", [(9, (0, 4, 8)), (10, (1, 2, 3)), (6, (5,)), (3, (2,))])
def test_dropouts_after_masking_up_to_a_third(n, drop):
    vals = _values(n, seed=1)
    srv, _ = run_sum(vals, drop_after_mask=drop)
    keep = [z for z in range(n) if z not in drop]
    ref = _plain_sum(vals, keep)
    assert srv.survivors == keep and srv.dropped == sorted(drop)
    assert np.abs(srv.result()["sums"] - ref["sums"]).max() <= n * 2.0 ** -21
    assert np.array_equal(srv.result()["counts"], ref["counts"])
    assert all("no answer" in srv.failed[z] for z in drop)


def test_too_many_dropouts_stop_with_one_line():
    vals = _values(9, seed=2)
    with pytest.raises(ValidationError, match=r"only 5 of the 9 devices holding device \d's "
                                              r"shares remain \(threshold 6\)"):
        run_sum(vals, drop_after_mask=(0, 1, 2, 3))


def test_dropout_before_sharing_is_just_absent():
    vals = _values(6, seed=3)
    srv, _ = run_sum(vals, drop_at_keys=(2,))
    ref = _plain_sum(vals, [0, 1, 3, 4, 5])
    assert np.array_equal(srv.result()["counts"], ref["counts"])


def test_sparse_graph_secagg_plus():
    vals = _values(40, seed=4, k=2, d=3)
    s = SecureAggregation(neighbors=8)
    srv, _ = run_sum(vals, settings=s, drop_after_mask=(5, 17))
    assert all(len(g) == 9 for g in srv.group.values())
    assert all(z in srv.group[v] for z in srv.ids for v in srv.group[z])  # symmetric
    keep = [z for z in range(40) if z not in (5, 17)]
    assert np.array_equal(srv.result()["counts"], _plain_sum(vals, keep)["counts"])
    assert np.abs(srv.result()["sums"] - _plain_sum(vals, keep)["sums"]).max() <= 40 * 2.0 ** -21


def test_masked_replies_hide_the_values_and_server_sees_only_the_sum():
    """Same sum, device 0's and 1's replies changed: the sum is unchanged, and each
    masked vector is unrelated to the plaintext (the same keys give different masks
    only through the values)."""
    vals = _values(5, seed=5)
    other = {z: dict(v) for z, v in vals.items()}
    delta = np.full((3, 4), 7.25)
    other[0]["sums"] = vals[0]["sums"] + delta
    other[1]["sums"] = vals[1]["sums"] - delta
    ent = lambda z, stage: _entropy(hash((z, stage)) % 2**32)  # noqa: E731  same keys both runs
    a, seen_a = run_sum(vals, entropy=ent)
    b, seen_b = run_sum(other, entropy=ent)
    assert np.array_equal(a.result()["sums"], b.result()["sums"])
    for z in range(5):
        plain, _ = encode_fixed(vals[z], 20, 5)
        assert not np.array_equal(seen_a[z], plain)
        # the masked words look uniform: about half of the top bits set
        top = (seen_a[z] >> np.uint64(63)).astype(int)
        assert 0 < top.sum() < top.size
    assert not np.array_equal(seen_a[0], seen_b[0])  # the wire changes, what the server keeps not
    # the keys and masks come from the pinned entropy alone: a rerun sends the same words
    _, seen_again = run_sum(vals, entropy=ent)
    assert all(np.array_equal(seen_a[z], seen_again[z]) for z in range(5))


def test_tampered_shares_reject_the_sender_by_name():
    vals = _values(7, seed=6)

    def tamper(z, inbound):
        if z == 3 and len(inbound["src"]):
            inbound = dict(inbound)
            ct = inbound["ct"].copy()
            row = list(inbound["src"]).index(5)
            ct[row, 0] ^= 1
            inbound["ct"] = ct
        return inbound

    srv, _ = run_sum(vals, tamper_ct=tamper)
    assert "device 5: its encrypted shares for device 3 failed authentication" in srv.rejected[5]
    keep = [0, 1, 2, 3, 4, 6]
    assert np.array_equal(srv.result()["counts"], _plain_sum(vals, keep)["counts"])
    assert np.abs(srv.result()["sums"] - _plain_sum(vals, keep)["sums"]).max() <= 7 * 2.0 ** -21


def test_device_refuses_inconsistent_unmask_request():
    vals = _values(4, seed=7)
    srv = SecureSumServer(range(4), 0, SecureAggregation(), 0)
    states = {z: {} for z in range(4)}
    for stage in ("keys", "share", "mask"):
        srv.take(stage, {z: secure_sum_client(stage, inb, states[z], device_id=z, reply=vals[z])
                         for z, inb in srv.requests(stage).items()})
    bad = {"round": np.asarray(0), "survivors": np.asarray([0, 1, 2, 3]),
           "dropped": np.asarray([3])}
    with pytest.raises(ValidationError, match="both survivor and dropped"):
        secure_sum_client("unmask", bad, states[0], device_id=0)
    ok = srv.requests("unmask")[0]
    secure_sum_client("unmask", ok, states[0], device_id=0)
    with pytest.raises(ValidationError, match="stage .unmask. already answered"):
        secure_sum_client("unmask", ok, states[0], device_id=0)


def test_a_sum_of_one_reply_is_refused():
    with pytest.raises(ValidationError, match="1 device\\(s\\) in the round; the sum of one "
                                              "reply is that reply"):
        SecureSumServer([4], 0, SecureAggregation(), 0)


def test_fixed_point_range_error_names_the_field():
    with pytest.raises(ValidationError, match=r"device 4: field 'sums' .* too large .* "
                                              r"lower frac_bits"):
        encode_fixed({"sums": np.array([1e13])}, 20, 10, sender="device 4")
    vec, layout = encode_fixed({"a": np.array([[1.5, -2.25]]), "n": np.array([2**60])}, 20, 2)
    back = decode_fixed(vec, layout, 20)
    assert np.array_equal(back["a"], [[1.5, -2.25]]) and back["n"][0] == 2**60


# -- Shamir ---------------------------------------------------------------------
def test_shamir_reconstructs_at_threshold_and_not_below():
    secret = bytes(range(32))
    xs = list(range(1, 8))
    shares = dict(zip(xs, shamir_split(secret, xs, 4, _entropy(0))))
    for subset in ([1, 2, 3, 4], [7, 5, 3, 1], [2, 4, 6, 7]):
        assert shamir_combine({x: shares[x] for x in subset}, 4) == secret
    with pytest.raises(ValidationError, match="3 shares for a threshold of 4"):
        shamir_combine({x: shares[x] for x in (1, 2, 3)}, 4)
    # below the threshold the shares say nothing: interpolating 3 of them gives another value,
    # and for ANY candidate secret a degree-3 polynomial through those 3 shares exists
    wrong = shamir_combine({x: shares[x] for x in (1, 2, 3)}, 3, size=66)
    assert wrong != secret.rjust(66, b"\0")
    for candidate in (0, 12345, PRIME - 1):
        pts = {0: candidate, 1: shares[1], 2: shares[2], 3: shares[3]}

        def f(x, pts=pts):   # Lagrange through the 4 points over GF(PRIME): degree <= 3
            total = 0
            for xi, y in pts.items():
                term = y
                for xj in pts:
                    if xj != xi:
                        term = term * (x - xj) * pow(xi - xj, -1, PRIME) % PRIME
                total += term
            return total % PRIME

        # a fourth share consistent with the same three makes the library reconstruct the
        # candidate: the three shares leave every secret possible
        fourth = {1: shares[1], 2: shares[2], 3: shares[3], 6: f(6)}
        assert shamir_combine(fourth, 4, size=66) == candidate.to_bytes(66, "big")
        assert (f(6) == shares[6]) == (candidate == int.from_bytes(secret, "big"))


def test_shamir_hand_case():
    # f(x) = s + 3x over GF(p), threshold 2: f(1) = s + 3, f(2) = s + 6
    s = 1000
    assert shamir_combine({1: s + 3, 2: s + 6}, 2) == s.to_bytes(32, "big")


def test_seal_detects_changes_and_prg_is_seeded():
    a_sk, a_pk = x25519_keypair()
    b_sk, b_pk = x25519_keypair()
    ct = seal(a_sk, b_pk, 1, 2, 0, b"shares")
    assert open_sealed(b_sk, a_pk, 1, 2, 0, ct) == b"shares"
    with pytest.raises(ValidationError, match="from device 1 to device 2 were altered"):
        open_sealed(b_sk, a_pk, 1, 2, 0, ct[:-1] + bytes([ct[-1] ^ 1]))
    with pytest.raises(ValidationError):
        open_sealed(b_sk, a_pk, 2, 1, 0, ct)  # a share re-addressed to someone else
    assert np.array_equal(prg_mask(b"k" * 32, 5), prg_mask(b"k" * 32, 9)[:5])
    assert not np.array_equal(prg_mask(b"k" * 32, 5), prg_mask(b"j" * 32, 5))


def test_shamir_combine_refuses_a_secret_one_past_its_size_and_names_bad_shares():
    # threshold 1: f(x) = s for every x, so the reconstruction is exactly s
    top = 1 << 32
    assert shamir_combine({1: top - 1, 2: top - 1}, 1, size=4) == b"\xff" * 4
    for s in (top, top + 1, 3 * top):
        with pytest.raises(ValidationError, match=r"^the shares do not belong to one secret "
                                                  r"\(reconstruction out of range\)$"):
            shamir_combine({1: s}, 1, size=4)
    secret = bytes(range(32))
    xs = list(range(1, 6))
    pts = dict(zip(xs, shamir_split(secret, xs, 2, _entropy(1))))
    pts[4] += 7
    with pytest.raises(ValidationError, match=r"^the shares at points \[4\] are inconsistent "
                                              r"with the others$"):
        shamir_combine(pts, 2, strict=True)
    with pytest.raises(ValidationError, match=r"^1 shares for a threshold of 2: the secret "
                                              r"cannot be reconstructed$"):
        shamir_combine({1: 5}, 2)


def test_fixed_point_round_trip_keeps_each_fields_dtype_and_checks_the_length():
    arrays = {"f32": np.array([0.5, -1.25], np.float32), "f64": np.array([[2.0**-20]]),
              "n": np.array([3, -4], np.int64), "scalar": np.float32(7.0)}
    vec, layout = encode_fixed(arrays, 20, 3)
    back = decode_fixed(vec, layout, 20)
    for name, a in arrays.items():
        assert back[name].dtype == np.asarray(a).dtype and back[name].shape == np.shape(a)
        np.testing.assert_array_equal(back[name], a)
    with pytest.raises(ValidationError, match=r"^secure sum has 7 entries, its layout 6$"):
        decode_fixed(np.concatenate([vec, vec[:1]]), layout, 20)


def test_fixed_point_limits_are_exact_and_integers_stay_exact():
    big = 2**62 + 1                        # not a float64: exact only on the integer path
    vec, layout = encode_fixed({"n": np.array([big, -big], np.int64)}, 20, 1)
    np.testing.assert_array_equal(decode_fixed(vec, layout, 20)["n"], [big, -big])
    # one device may use the whole signed range (limit 2**63), nothing at or past it
    with pytest.raises(ValidationError, match=r"^device: field 'n' has a value too large to sum "
                                              r"over 1 devices with frac_bits=20 \(limit "
                                              r"9\.22337e\+18 in magnitude\); lower frac_bits$"):
        encode_fixed({"n": np.array([2**63 - 1], np.int64)}, 20, 1)
    limit = 2.0**63 / 4 / 2.0**20          # floats: the limit over 4 devices in value units
    encode_fixed({"x": np.array([np.nextafter(limit, 0)])}, 20, 4)
    with pytest.raises(ValidationError, match=r"^device: field 'x' has a value too large to sum "
                                              r"over 4 devices with frac_bits=20 \(limit "
                                              r"2\.19902e\+12 in magnitude\); lower frac_bits$"):
        encode_fixed({"x": np.array([-limit])}, 20, 4)
    with pytest.raises(ValidationError, match=r"^device: field 'x' has non-finite values; "
                                              r"secure aggregation sums finite numbers only$"):
        encode_fixed({"x": np.array([1.0, np.nan])}, 20, 4)
    with pytest.raises(ValidationError, match=r"^secure aggregation sums numbers: field 'b' has "
                                              r"dtype bool$"):
        encode_fixed({"b": np.array([True])}, 20, 4)
    vec, layout = encode_fixed({}, 20, 4)
    assert vec.dtype == np.uint64 and vec.shape == (0,) and decode_fixed(vec, layout, 20) == {}


def test_key_agreement_separates_purposes_and_rounds():
    from fedclust.core.secagg import agree, pair_mask_seed

    a_sk, a_pk = x25519_keypair(_entropy(1))
    b_sk, b_pk = x25519_keypair(_entropy(2))
    assert agree(a_sk, b_pk, b"mask") == agree(b_sk, a_pk, b"mask")
    assert agree(a_sk, b_pk, b"mask") != agree(a_sk, b_pk, b"seal")
    seeds = [pair_mask_seed(a_sk, b_pk, r) for r in range(3)]
    assert seeds[0] == pair_mask_seed(b_sk, a_pk, 0) and len(set(seeds)) == 3   # fresh masks
    ct = seal(a_sk, b_pk, 1, 2, 0, b"shares")
    assert open_sealed(b_sk, a_pk, 1, 2, 0, ct) == b"shares"
    with pytest.raises(ValidationError, match=r"^the shares from device 1 to device 2 were "
                                              r"altered on the way \(authentication failed\)$"):
        open_sealed(b_sk, a_pk, 1, 2, 1, ct)   # another round's key


def test_shamir_coefficients_span_the_field_and_secrets_must_be_below_its_prime():
    # threshold 2: f(1) - f(0) is the random coefficient; uniform over GF(PRIME) (521 bits),
    # so among 64 draws one has its top bit set unless the draw is too short
    top = max((shamir_split(b"\x01", [1, 2], 2)[0] - 1) % PRIME for _ in range(64))
    assert top.bit_length() == 521
    with pytest.raises(ValidationError, match=r"^secret too large for the Shamir field$"):
        shamir_split(PRIME.to_bytes(66, "big"), [1, 2], 2)
    shamir_split((PRIME - 1).to_bytes(66, "big"), [1, 2], 2)
    with pytest.raises(ValidationError, match=r"^share points must be distinct and non-zero$"):
        shamir_split(b"\x01", [1, 1], 2)
    with pytest.raises(ValidationError, match=r"^threshold=3 must be in \[1, 2\] shares$"):
        shamir_split(b"\x01", [1, 2], 3)
    ys = shamir_split(b"\x05", [1, 2, 3, 4, 5], 3)
    pts = {x: y + (x in (1, 2)) for x, y in zip([1, 2, 3, 4, 5], ys)}
    with pytest.raises(ValidationError, match=r"^5 shares are inconsistent \(not on one "
                                              r"polynomial of degree 2\) and more than 1 of them "
                                              r"would have to be wrong: cannot tell which$"):
        shamir_combine(pts, 3)


def test_a_survivor_silent_at_unmask_stays_in_the_sum():
    vals = _values(6, seed=8)
    srv = SecureSumServer(list(range(6)), round_id=3, settings=SecureAggregation(), seed=0)
    states = {z: {} for z in range(6)}
    for stage in ("keys", "share", "mask", "unmask"):
        replies = {z: secure_sum_client(stage, inbound, states[z], device_id=z,
                                        reply=vals[z] if stage == "mask" else None)
                   for z, inbound in srv.requests(stage).items()}
        if stage == "unmask":
            del replies[0]          # the lowest survivor masked its reply, then went quiet
        srv.take(stage, replies)
    got, want = srv.result(), _plain_sum(vals, list(range(6)))
    np.testing.assert_array_equal(got["counts"], want["counts"])
    np.testing.assert_allclose(got["sums"], want["sums"], atol=6 * 2.0**-20, rtol=0)


@pytest.mark.parametrize("kw,ok", [(dict(frac_bits=0), True), (dict(frac_bits=52), True),
                                   (dict(frac_bits=-1), False), (dict(frac_bits=53), False),
                                   (dict(neighbors=2), True), (dict(neighbors=1), False)])
def test_secure_aggregation_settings_edges(kw, ok):
    if ok:
        SecureAggregation(**kw)
    else:
        with pytest.raises(ValidationError, match=r"^(frac_bits=-?\d+ must be in \[0, 52\]|"
                                                  r"neighbors=1 must be >= 2 \(or None\))$"):
            SecureAggregation(**kw)
