"""The federated preprocessing as plain sums, and under secure aggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedclust.core.exceptions import ValidationError
from fedclust.core.secure_sum import SUMMED
from fedclust.sites.preprocess import (SQUARES, SUMS, ColumnSums, FederatedPreprocessor,
                                 PreprocessProtocol)
from fedclust.privacy import DifferentialPrivacy
from fedclust.sim.transport import InProcessTransport

N_SITES = 6


@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(7)
    # a large offset: a plain Σx² would lose the variance to cancellation in fixed point
    out = []
    for z, n in enumerate((30, 50, 21, 40, 25, 35)):
        X = rng.normal([1e4, -3.0, 0.0, 250.0], [3.0, 0.5, 1e-3, 40.0], size=(n, 4)) + z
        X[rng.random(X.shape) < 0.15] = np.nan
        out.append(X)
    return out


def _sklearn(devs):
    return make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()).fit(np.vstack(devs))[-1]


def test_summed_rounds_equal_sklearn_without_and_with_secure_aggregation(sites):
    ref = _sklearn(sites)
    plain = InProcessTransport().run(PreprocessProtocol(4, summed=True), dict(enumerate(sites)), 0)
    np.testing.assert_allclose(plain.result.mean, ref.mean_, rtol=1e-12, atol=0)
    np.testing.assert_allclose(plain.result.scale, ref.scale_, rtol=1e-12, atol=0)
    assert plain.meter.rounds == 2

    sec = FederatedPreprocessor(secure_aggregation=True).fit(sites)
    # each site's sum is rounded to 2**-20: the pooled mean is off by <= sites * 2**-21 / count
    np.testing.assert_allclose(sec.mean_, ref.mean_, rtol=0,
                               atol=N_SITES * 2.0 ** -21 / sec.n_samples_seen_.min())
    np.testing.assert_allclose(sec.scale_, ref.scale_, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(sec.n_samples_seen_, (~np.isnan(np.vstack(sites))).sum(axis=0))
    assert sec.n_rows_ == ref.n_samples_seen_ == 201
    assert sec.communication_["secure_exchanges"] == 2 * 3
    # the transform each site then applies is the same within that precision
    for X in sites[:2]:
        np.testing.assert_allclose(sec.transform(X), ref.transform(SimpleImputer().fit(
            np.vstack(sites)).transform(X)), atol=1e-6)


class _Spy(PreprocessProtocol):
    seen: list

    def server_step(self, state, request, replies):
        self.seen.append((request.action, {z: r.to_arrays() for z, r in replies.items()}))
        super().server_step(state, request, replies)


def _spy_run(sites, tamper=None, secure=True, **kw):
    p = _Spy(4, summed=True, **kw)
    p.seen = []
    out = InProcessTransport(secure_aggregation=secure, tamper=tamper).run(
        p, dict(enumerate(sites)), 3)
    return p.seen, out


def test_server_sees_only_sums_that_do_not_move_when_a_reply_moves_with_the_sum(sites):
    seen, _ = _spy_run(sites)
    assert [a for a, _ in seen] == [SUMS, SQUARES]
    assert all(list(r) == [SUMMED] for _, r in seen)

    def shift(z, rnd, arrays):  # device 0 gives, device 1 takes: the sums stay
        if z not in (0, 1):
            return arrays
        sign = 1.0 if z == 0 else -1.0
        key = "total" if "total" in arrays else "sq"
        return {**arrays, key: arrays[key] + sign * 5.0}

    moved, _ = _spy_run(sites, tamper=shift)
    for (_, a), (_, b) in zip(seen, moved):
        for field in a[SUMMED]:
            np.testing.assert_array_equal(a[SUMMED][field], b[SUMMED][field])
    plain, _ = _spy_run(sites, secure=False)
    plain_moved, _ = _spy_run(sites, tamper=shift, secure=False)
    assert not np.array_equal(plain[0][1][0]["total"], plain_moved[0][1][0]["total"])
    # and no device's own sums reach the server's code under secure aggregation
    own = [r["total"] for r in plain[0][1].values()]
    assert not any(np.allclose(seen[0][1][SUMMED]["total"], t) for t in own)


def test_a_third_dropping_after_masking_gives_the_survivors_statistics(sites):
    t = InProcessTransport(secure_aggregation=True, drop_after_masking=[1, 4],
                           on_client_error="drop")
    pre = FederatedPreprocessor().fit(sites, transport=t)
    assert sorted(pre.run_log_.failed) == [1, 4]
    kept = [X for z, X in enumerate(sites) if z not in (1, 4)]
    ref = _sklearn(kept)
    assert pre.n_rows_ == sum(len(X) for X in kept)
    np.testing.assert_allclose(pre.mean_, ref.mean_, atol=4 * 2.0 ** -21, rtol=0)
    np.testing.assert_allclose(pre.scale_, ref.scale_, rtol=1e-6)


def test_a_site_answering_one_round_only_stops_the_fit(sites):
    class Flaky(PreprocessProtocol):
        def client_step(self, request, X, *, device_id, seed, state):
            if request.action == SQUARES and device_id == 2:
                raise ValidationError("device 2: gone")
            return super().client_step(request, X, device_id=device_id, seed=seed, state=state)

    with pytest.raises(ValidationError, match="a site answered one round only"):
        InProcessTransport(on_client_error="drop").run(Flaky(4, summed=True),
                                                       dict(enumerate(sites)), 0)


def test_one_round_form_is_refused_by_secure_aggregation_with_its_reason(sites):
    with pytest.raises(ValidationError, match="Chan's merge"):
        InProcessTransport(secure_aggregation=True).run(PreprocessProtocol(4),
                                                        dict(enumerate(sites)), 0)
    with pytest.raises(ValidationError, match="transport has secure_aggregation off"):
        FederatedPreprocessor(secure_aggregation=True).fit(sites, transport=InProcessTransport())
    bad = ColumnSums(count=np.array([3, 4]), total=np.zeros(2), n_rows=np.asarray(3))
    with pytest.raises(ValidationError, match="counts must lie in 0..n_rows=3"):
        bad.validate("device 9")


def test_private_summed_rounds_release_the_same_mechanism(sites):
    bounds = [(9e3, 1.1e4), (-6.0, 0.0), (-1.0, 1.0), (0.0, 500.0)]
    kw = dict(bounds=bounds)
    inf = DifferentialPrivacy(epsilon=math.inf, delta=1e-5)
    a = FederatedPreprocessor(privacy=inf, **kw).fit(sites)
    b = FederatedPreprocessor(privacy=inf, secure_aggregation=True, **kw).fit(sites)
    np.testing.assert_allclose(b.mean_, a.mean_, atol=N_SITES * 2.0 ** -21 / 20, rtol=0)
    np.testing.assert_allclose(b.scale_, a.scale_, rtol=1e-6)
    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-5, noise_seed=5)
    one = FederatedPreprocessor(privacy=dp, **kw).fit(sites)
    two = InProcessTransport().run(
        PreprocessProtocol(4, summed=True, privacy=dp, lower=[r[0] for r in bounds],
                           upper=[r[1] for r in bounds]), dict(enumerate(sites)), 0).result
    sec = FederatedPreprocessor(privacy=dp, secure_aggregation=True, **kw).fit(sites)
    # the same noise on the same statistic: the one-round and summed forms agree
    np.testing.assert_allclose(two.mean, one.mean_, rtol=1e-9)
    np.testing.assert_allclose(two.var, one.var_, rtol=1e-9)
    np.testing.assert_allclose(sec.mean_, one.mean_, rtol=1e-6)
    assert sec.privacy_["releases"] == one.privacy_["releases"]
    assert not np.allclose(one.mean_, a.mean_, rtol=1e-9)  # the noise is there


def test_flower_message_api_gives_the_secure_in_process_result(sites):
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    a = FederatedPreprocessor(secure_aggregation=True).fit(sites[:4])
    b = FederatedPreprocessor().fit(sites[:4],
                                    transport=FlowerInMemoryTransport(secure_aggregation=True))
    np.testing.assert_array_equal(a.mean_, b.mean_)
    np.testing.assert_array_equal(a.scale_, b.scale_)
    assert a.communication_ == b.communication_
