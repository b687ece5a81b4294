"""Federated EM rounds (``em_rounds``): owners' statistics against pooled references
(scipy log-densities, scikit-learn's GaussianMixture), the BIC choice, both transports,
bytes and refusals."""

import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

from fedclust import FedGaussClustering
from fedclust.core.exceptions import IncompatibleMessageError, ValidationError
from fedclust.flower import FlowerInMemoryTransport
from fedclust.gauss.federated_em import (Mixture, apply_edit, candidate_edits, choose_and_step,
                                         device_statistics, integer_counts, n_parameters)
from fedclust.gauss.messages import GaussEMStats


def _mixture(full, K=3, D=3, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, K)
    mu = rng.normal(scale=4.0, size=(K, D))
    if full:
        A = rng.normal(size=(K, D, D))
        covs = A @ np.transpose(A, (0, 2, 1)) + 0.5 * np.eye(D)
    else:
        covs = rng.uniform(0.3, 2.0, size=(K, D))
    return Mixture(w / w.sum(), mu, covs)


def _rows(seed=1, n=(150, 220), D=3):
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=3.0, size=(m, D)) + rng.normal(size=D) for m in n]


def _scipy_lp(X, mix):
    cols = []
    for k in range(mix.K):
        cov = mix.covs[k] if mix.full else np.diag(mix.covs[k])
        cols.append(np.log(mix.weights[k]) + multivariate_normal(mix.means[k], cov).logpdf(X))
    return np.stack(cols, axis=1)


def _scipy_loglik(X, mix):
    return float(logsumexp(_scipy_lp(X, mix), axis=1).sum())


def _scipy_entropy(X, mix):
    lp = _scipy_lp(X, mix)
    R = np.exp(lp - logsumexp(lp, axis=1, keepdims=True))
    return float(-(R * np.log(R)).sum())


def _summed(devices, mix, edits):
    parts = [device_statistics(X, mix, edits) for X in devices]
    return tuple(sum(p[i] for p in parts) for i in range(5))


@pytest.mark.parametrize("full", [True, False])
def test_owner_logliks_summed_are_the_pooled_rows_loglik_of_every_candidate(full):
    mix = _mixture(full)
    devices = _rows()
    X = np.concatenate(devices)
    edits = candidate_edits(mix, m=2)
    assert len(edits) == 6 and (edits[:, 1] == -1).sum() == 2 and (edits[:, 1] == -2).sum() == 2
    ll, ent = (_summed(devices, mix, edits)[i] for i in (0, 4))
    assert ll[0] == pytest.approx(_scipy_loglik(X, mix), rel=1e-10)
    assert ent[0] == pytest.approx(_scipy_entropy(X, mix), rel=1e-8)
    for e, value, h in zip(edits, ll[1:], ent[1:]):
        # the candidate built by hand: a merge moment-matches the pair, a drop renormalises
        p, q = e
        keep = [k for k in range(mix.K) if k not in (p, q)]
        if q == -2:  # the two halves of component p cut at its mean across its widest axis
            C = mix.covs[p] if full else np.diag(mix.covs[p])
            lam, V = np.linalg.eigh(C)
            v = V[:, -1]
            half = C - 2 / np.pi * lam[-1] * np.outer(v, v)
            # moments of a half of the Gaussian, by Monte Carlo on many draws
            Z = np.random.default_rng(9).multivariate_normal(mix.means[p], C, 400_000)
            side = (Z - mix.means[p]) @ v > 0
            np.testing.assert_allclose(np.cov(Z[side].T), half, atol=0.03 * lam[-1])
            shift = np.sqrt(2 * lam[-1] / np.pi) * v
            np.testing.assert_allclose(Z[side].mean(axis=0), mix.means[p] + shift,
                                       atol=0.01 * np.sqrt(lam[-1]))
            ref = Mixture(np.append(mix.weights[keep], [mix.weights[p] / 2] * 2),
                          np.vstack([mix.means[keep], mix.means[p] - shift,
                                     mix.means[p] + shift]),
                          np.concatenate([mix.covs[keep], (half if full else np.diag(half))[None],
                                          (half if full else np.diag(half))[None]]))
            # merging the halves back gives the component again
            back = apply_edit(ref, (mix.K - 1, mix.K))
            np.testing.assert_allclose(back.means[-1], mix.means[p], atol=1e-12)
            np.testing.assert_allclose(back.covs[-1], mix.covs[p], atol=1e-12)
        elif q < 0:
            ref = Mixture(mix.weights[keep] / mix.weights[keep].sum(), mix.means[keep],
                          mix.covs[keep])
        else:
            w = mix.weights[[p, q]]
            m = w @ mix.means[[p, q]] / w.sum()
            if full:
                c = sum(w[i] * (mix.covs[j] + np.outer(mix.means[j] - m, mix.means[j] - m))
                        for i, j in enumerate((p, q))) / w.sum()
            else:
                c = sum(w[i] * (mix.covs[j] + (mix.means[j] - m) ** 2)
                        for i, j in enumerate((p, q))) / w.sum()
            ref = Mixture(np.append(mix.weights[keep], w.sum()),
                          np.vstack([mix.means[keep], m]),
                          np.concatenate([mix.covs[keep], c[None]]))
        assert value == pytest.approx(_scipy_loglik(X, ref), rel=1e-10)
        assert h == pytest.approx(_scipy_entropy(X, ref), rel=1e-8)


@pytest.mark.parametrize("full", [True, False])
def test_one_federated_em_step_is_scikit_learns_em_step_on_the_pooled_rows(full):
    mix = _mixture(full, seed=3)
    devices = _rows(seed=4, n=(90, 130, 60))
    X = np.concatenate(devices)
    ll, N, first, second, _ = _summed(devices, mix, np.zeros((0, 2), np.int64))
    new, S, kept, bic = choose_and_step(mix, np.zeros((0, 2), np.int64), ll, N, first, second,
                                        np.zeros(X.shape[1]))
    assert kept == 0
    prec = np.linalg.inv(mix.covs) if full else 1.0 / mix.covs
    gm = GaussianMixture(mix.K, covariance_type="full" if full else "diag", max_iter=1,
                         reg_covar=0.0, weights_init=mix.weights, means_init=mix.means,
                         precisions_init=prec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(X)
    np.testing.assert_allclose(new.weights, gm.weights_, rtol=1e-9)
    np.testing.assert_allclose(new.means, gm.means_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(new.covs, gm.covariances_, rtol=1e-8, atol=1e-10)
    # the scatters are about the new means: S_k = N_k Sigma_k
    np.testing.assert_allclose(S, N[:, None, None] * new.covs if full else N[:, None] * new.covs,
                               rtol=1e-8, atol=1e-8)
    # the BIC of the current mixture: -2 log L + p log N at the broadcast parameters
    p = n_parameters(mix.K, X.shape[1], full)
    assert p == gm._n_parameters()
    assert bic[0] == pytest.approx(-2 * _scipy_loglik(X, mix) + p * np.log(len(X)), rel=1e-10)
    # ICL: the same plus twice the entropy of the responsibilities (scikit-learn's)
    icl = choose_and_step(mix, np.zeros((0, 2), np.int64), ll, N, first, second,
                          np.zeros(X.shape[1]), entropy=_summed(devices, mix, [])[4])[3]
    assert icl[0] - bic[0] == pytest.approx(2 * _scipy_entropy(X, mix), rel=1e-8)


def test_a_merge_pools_both_components_responsibilities():
    # one Gaussian described by two halves and a far one: the merge has the lowest BIC
    rng = np.random.default_rng(5)
    a = rng.normal(size=(600, 2))
    b = rng.normal(size=(300, 2)) + [12.0, 0.0]
    devices = [np.concatenate([a[:300], b[:100]]), np.concatenate([a[300:], b[100:]])]
    X = np.concatenate(devices)
    mix = Mixture(np.array([1 / 3, 1 / 3, 1 / 3]), np.array([[-0.8, 0.0], [0.8, 0.0], [12, 0.0]]),
                  np.array([np.diag([0.4, 1.0]), np.diag([0.4, 1.0]), np.eye(2)]))
    edits = candidate_edits(mix, m=3)
    ll, N, first, second, _ = _summed(devices, mix, edits)
    new, S, kept, bic = choose_and_step(mix, edits, ll, N, first, second, np.zeros(2))
    assert kept > 0 and list(edits[kept - 1]) == [0, 1]
    assert int(np.argmin(bic)) == kept
    # the merged component (last) is the M-step of r_0 + r_1 computed on the pooled rows
    lp = np.stack([np.log(mix.weights[k]) + multivariate_normal(mix.means[k], mix.covs[k])
                   .logpdf(X) for k in range(3)], axis=1)
    R = np.exp(lp - logsumexp(lp, axis=1, keepdims=True))
    r = R[:, 0] + R[:, 1]
    m = r @ X / r.sum()
    C = ((X - m) * r[:, None]).T @ (X - m) / r.sum()
    assert new.K == 2
    np.testing.assert_allclose(new.means[-1], m, atol=1e-10)
    np.testing.assert_allclose(new.covs[-1], C, atol=1e-10)
    np.testing.assert_allclose(new.weights[-1], r.sum() / len(X), rtol=1e-12)


def test_integer_counts_add_up_to_the_rows():
    rng = np.random.default_rng(0)
    for _ in range(20):
        N = rng.uniform(0, 50, rng.integers(1, 9))
        total = int(rng.integers(100, 1000))
        c = integer_counts(N, total)
        assert c.sum() == total and (np.abs(c - N * total / N.sum()) < 1).all()


def _overlapping_federation(seed=0):
    """Three elongated, touching Gaussians over three owners of unequal sizes; each owner
    holds mostly one of them (non-IID)."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [7.0, 1.0], [3.0, 6.0]])
    A = np.array([[2.0, 0.0], [0.8, 0.7]])
    y = np.repeat(np.arange(3), [500, 400, 300])
    X = centres[y] + rng.normal(size=(len(y), 2)) @ A
    owner = np.where(rng.uniform(size=len(y)) < 0.7, y, rng.integers(0, 3, len(y)))
    return [X[owner == z] for z in range(3)], [y[owner == z] for z in range(3)]


def test_em_rounds_reach_the_pooled_gaussian_mixtures_answer():
    owners, ys = _overlapping_federation()
    X, y = np.concatenate(owners), np.concatenate(ys)
    fc = FedGaussClustering(em_rounds=40, em_criterion="bic", random_state=0).fit(owners)
    trace = fc.em_trace_
    assert 1 <= len(trace) <= 40
    assert fc.communication_["rounds"] == 1 + len(trace)
    # every row is in the mixture after EM
    assert fc.counts_.sum() == len(X) and fc.removed_samples_ == 0
    # the BIC of the kept model fell (or held) over the rounds
    assert trace[-1]["scores"][0] <= trace[0]["scores"][0] + 1e-9 * abs(trace[0]["scores"][0])
    # the pooled reference: scikit-learn's BIC-best GaussianMixture
    ref = min((GaussianMixture(k, n_init=3, random_state=0).fit(X) for k in range(1, 7)),
              key=lambda g: g.bic(X))
    assert fc.n_clusters_ == ref.n_components
    labels = np.concatenate(fc.device_labels_)
    assert adjusted_rand_score(ref.predict(X), labels) > 0.95
    assert adjusted_rand_score(y, labels) > adjusted_rand_score(y, ref.predict(X)) - 0.03


def test_icl_counts_clusters_where_bic_counts_gaussians():
    # a heavy-tailed cluster (two Gaussians sharing a centre) and a far compact one
    rng = np.random.default_rng(7)
    X = np.concatenate([rng.normal(size=(1500, 2)), 3.0 * rng.normal(size=(1500, 2)),
                        rng.normal(size=(800, 2)) + [40.0, 0.0]])
    y = np.repeat([0, 0, 1], [1500, 1500, 800])
    p = rng.permutation(len(X))
    owners = np.array_split(X[p], 3)
    # the pooled references: BIC wants three Gaussians here, two of them sharing rows
    bic_k = min(range(1, 6), key=lambda k: GaussianMixture(k, n_init=3, random_state=0)
                .fit(X).bic(X))
    assert bic_k == 3
    icl = FedGaussClustering(em_rounds=30, em_criterion="icl", random_state=0).fit(owners)
    bic = FedGaussClustering(em_rounds=30, em_criterion="bic", random_state=0).fit(owners)
    assert bic.n_clusters_ == 3 and icl.n_clusters_ == 2
    assert adjusted_rand_score(y[p], icl.labels_) > 0.99
    assert {t["criterion"] for t in icl.em_trace_} == {"icl"}


def test_em_rounds_same_on_flower_and_bytes_follow_the_formula():
    owners, _ = _overlapping_federation(1)
    a = FedGaussClustering(em_rounds=4, em_criterion="bic", random_state=0).fit(owners)
    b = FedGaussClustering(em_rounds=4, em_criterion="bic", random_state=0).fit(
        owners, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.counts_, b.counts_)
    for la, lb in zip(a.device_labels_, b.device_labels_):
        np.testing.assert_array_equal(la, lb)
    assert a.communication_["bytes_up"] == b.communication_["bytes_up"]
    base = FedGaussClustering(random_state=0).fit(owners)
    D = 2
    w = D * (D + 1) // 2
    up = sum(8 * (2 * len(t["scores"]) + t["components"] * (1 + D + w)) for t in a.em_trace_)
    down = sum(8 * (t["components"] * (1 + D + w) + 2 * (len(t["scores"]) - 1))
               for t in a.em_trace_)
    for z in map(str, range(3)):
        got, ref = a.communication_["per_device"][z], base.communication_["per_device"][z]
        assert got["up"] - ref["up"] == up
        # the final model sent down differs in size; the EM rounds' part is exact
        assert got["down"] - ref["down"] - down == 8 * (a.n_clusters_ - base.n_clusters_) * (
            D + w + 2)


def test_em_rounds_zero_leaves_the_default_untouched_and_refusals():
    owners, _ = _overlapping_federation(2)
    a = FedGaussClustering(random_state=0).fit(owners)
    assert a.em_trace_ == [] and a.communication_["rounds"] == 1
    from fedclust.privacy import DifferentialPrivacy

    with pytest.raises(ValidationError, match="em_rounds=3 is not available with privacy"):
        FedGaussClustering(em_rounds=3, privacy=DifferentialPrivacy(
            1.0, 1e-6, data_bound=20.0)).fit(owners)
    with pytest.raises(ValidationError, match="em_rounds"):
        FedGaussClustering(em_rounds=-1).fit(owners)
    from fedclust.gauss import GaussClassifierProtocol

    with pytest.raises(ValidationError, match="classifier has none"):
        GaussClassifierProtocol(classes=[0, 1], em_rounds=2)


def test_a_tampered_em_reply_is_rejected_by_name():
    good = dict(loglik=np.array([-10.0, -11.0]), entropy=np.array([3.0, 2.5]),
                resp=np.array([3.0, 2.0]),
                first=np.zeros((2, 2)), second=np.array([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]))
    GaussEMStats.from_arrays(good, sender="device 4")
    with pytest.raises(IncompatibleMessageError, match="device 4: resp"):
        GaussEMStats.from_arrays({**good, "resp": np.array([3.0, -2.0])}, sender="device 4")
    with pytest.raises(IncompatibleMessageError, match="device 4: a second-moment matrix"):
        GaussEMStats.from_arrays({**good, "second": np.array([[1.0, 5.0, 1.0], [1.0, 0, 1.0]])},
                                 sender="device 4")
    with pytest.raises(IncompatibleMessageError, match="device 4: entropy sums"):
        GaussEMStats.from_arrays({**good, "entropy": np.array([3.0, -1.0])}, sender="device 4")
    with pytest.raises(IncompatibleMessageError, match="device 4: field 'loglik'"):
        GaussEMStats.from_arrays({**good, "loglik": np.array([np.nan, 1.0])}, sender="device 4")


def test_a_tampered_em_round_reply_is_rejected_and_the_rounds_go_on():
    from fedclust.sim.transport import InProcessTransport

    def tamper(z, rnd, arrays):
        if z != 1 or "loglik" not in arrays:
            return arrays
        a = dict(arrays)
        if rnd == 1:  # a huge log-likelihood for every candidate, wrong length
            a["loglik"] = np.full(a["loglik"].size + 1, 1e12)
            a["entropy"] = np.zeros(a["loglik"].size)
        else:
            a["resp"] = -a["resp"]
        return a

    owners, _ = _overlapping_federation(3)
    fc = FedGaussClustering(em_rounds=3, em_criterion="bic", random_state=0).fit(
        owners, transport=InProcessTransport(tamper=tamper))
    assert "device 1" in fc.run_log_.rejected[1]
    assert len(fc.em_trace_) >= 1 and np.isfinite(fc.means_).all()
    # the rounds went on with the other owners; the counts stay those of every row learnt
    assert fc.counts_.sum() == sum(len(o) for o in owners) and fc.removed_samples_ == 0
    honest = FedGaussClustering(em_rounds=3, em_criterion="bic", random_state=0).fit(owners)
    assert not honest.run_log_.rejected and not np.array_equal(honest.means_, fc.means_)


def test_a_malformed_mixture_from_the_server_is_refused_by_the_owner():
    from fedclust.gauss.messages import GaussMixture

    good = dict(weights=np.array([0.5, 0.5]), means=np.zeros((2, 2)),
                covs=np.array([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
                edits=np.array([[0, 1], [1, -1], [0, -2]]))
    GaussMixture.from_arrays(good, sender="server")
    with pytest.raises(IncompatibleMessageError, match="server: a covariance is not positive"):
        GaussMixture.from_arrays({**good, "covs": np.array([[1.0, 2.0, 1.0], [1, 0, 1.0]])},
                                 sender="server")
    with pytest.raises(IncompatibleMessageError, match="server: edits must be"):
        GaussMixture.from_arrays({**good, "edits": np.array([[1, 0]])}, sender="server")
    with pytest.raises(IncompatibleMessageError, match="server: weights must be"):
        GaussMixture.from_arrays({**good, "weights": np.array([0.9, 0.3])}, sender="server")
