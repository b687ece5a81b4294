"""Private federated preprocessing: clipping to public column ranges, one accounted release."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import KeepOutput
from fedclust.core.exceptions import ValidationError
from fedclust.lloyd import DistributedLloyd
from fedclust.sites.preprocess import FederatedPreprocessor, PreprocessProtocol
from fedclust.privacy import DifferentialPrivacy, Release, calibrate, composed_epsilon
from fedclust.privacy import columns as pc

from scipy.optimize import brentq
from scipy.stats import norm

def analytic_multiplier(eps: float, delta: float) -> float:
    """Balle & Wang (2018), Thm 8: the exact noise multiplier of one Gaussian release."""
    f = lambda z: (norm.cdf(-eps * z + 1 / (2 * z))  # noqa: E731
                   - math.exp(eps) * norm.cdf(-eps * z - 1 / (2 * z)) - delta)
    return brentq(f, 1e-2, 1e4, xtol=1e-10)


BOUNDS = [[-20.0, 120.0], [0.0, 600.0], [-1.0, 1.0], [0.0, 30.0]]


def sites(seed=0, sizes=(120, 300, 45), missing=0.15):
    rng = np.random.default_rng(seed)
    out = []
    for z, n in enumerate(sizes):
        X = np.column_stack([rng.normal(50 + 5 * z, 12, n), rng.normal(240, 50, n),
                             rng.uniform(-0.5, 0.5, n), rng.poisson(3 + z, n)]).astype(float)
        X[rng.random(X.shape) < missing] = np.nan
        out.append(X)
    return out


def test_infinite_epsilon_is_the_non_private_preprocessor_bit_for_bit():
    devs = sites(1)
    ref = FederatedPreprocessor().fit(devs)
    inf = FederatedPreprocessor(privacy=DifferentialPrivacy(math.inf, 1e-6),
                                bounds=BOUNDS).fit(devs)
    for a in ("mean_", "var_", "scale_", "n_samples_seen_"):
        assert np.array_equal(getattr(ref, a), getattr(inf, a)), a
    assert ref.n_rows_ == inf.n_rows_
    assert np.array_equal(np.vstack(ref.transform(devs)), np.vstack(inf.transform(devs)),
                          equal_nan=True)
    assert "clipped" not in inf.privacy_
    assert inf.privacy_["releases"][0]["noise_std"] == 0.0


def test_sensitivity_is_the_largest_change_one_row_makes():
    """Hand check of Δ = sqrt(1 + 2.25 d): the release vector of D and of D plus one row."""
    d = len(BOUNDS)
    low, high = np.array(BOUNDS).T
    c, w = (low + high) / 2, (high - low) / 2

    def stat(X):
        ok = ~np.isnan(X)
        u = np.where(ok, (X - c) / w, 0.0)
        return np.concatenate([[len(X)], ok.sum(0), u.sum(0), np.where(ok, u * u - 0.5, 0).sum(0)])

    X = np.vstack(sites(2))
    X = np.clip(X, low, high)
    worst = max(np.linalg.norm(stat(np.vstack([X, row])) - stat(X))
                for row in [high, low, c, np.where([1, 0, 1, 0], high, np.nan), (low + c) / 2])
    rel = pc.column_moments_release(d)
    assert worst == pytest.approx(rel.sensitivity, rel=1e-12)   # reached at a corner
    assert rel.sensitivity == pytest.approx(math.sqrt(1 + 2.25 * d))


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_noise_scale_equals_the_calibration(eps):
    devs = sites(3)
    pre = FederatedPreprocessor(privacy=DifferentialPrivacy(eps, 1e-6), bounds=BOUNDS).fit(devs)
    rel = pre.privacy_["releases"][0]
    z_exact = analytic_multiplier(eps, 1e-6)     # Balle & Wang, one Gaussian release
    assert z_exact <= rel["noise_multiplier"] <= 1.01 * z_exact
    assert rel["noise_std"] == pytest.approx(rel["noise_multiplier"] * math.sqrt(1 + 2.25 * 4))
    assert pre.privacy_["epsilon_spent"] <= eps


def test_released_mean_has_the_calibrated_variance():
    """3,000 releases of one pooled statistic: std of the mean = w σ / n (count noise small)."""
    n = 200_000
    low, high = np.array([0.0, -5.0]), np.array([10.0, 5.0])
    count = np.array([n, n // 2])
    mean = np.array([3.0, 1.0])
    total, m2 = mean * count, np.array([4.0, 2.0]) * count
    std = 40.0
    rng = np.random.default_rng(7)
    means = np.array([pc.noisy_column_moments(n, count, total, m2, low, high, std, rng)["mean"]
                      for _ in range(3000)])
    w, c = (high - low) / 2, (high + low) / 2
    # mean = c + w (S + N_s) / (n + N_n): to first order std = sqrt(w^2 + (mean - c)^2) σ / n
    expect = np.sqrt(w ** 2 + (mean - c) ** 2) * std / count
    np.testing.assert_allclose(means.std(axis=0), expect, rtol=0.05)
    np.testing.assert_allclose(means.mean(axis=0), mean, atol=4 * expect.max() / math.sqrt(3000))


def test_clipping_to_the_public_ranges_is_counted_per_site():
    devs = sites(4, missing=0.0)
    devs[1][0, 1] = 5000.0
    devs[1][3, 0] = -300.0
    devs[2][5, 3] = 31.0
    t = KeepOutput()
    pre = FederatedPreprocessor(privacy=DifferentialPrivacy(math.inf, 1e-6),
                                bounds=BOUNDS).fit(devs, transport=t)
    assert t.clipped(range(3)) == [0, 2, 1]   # counted on each site, not released
    clipped = [np.clip(X, *np.array(BOUNDS).T) for X in devs]
    ref = FederatedPreprocessor().fit(clipped)
    np.testing.assert_array_equal(pre.mean_, ref.mean_)
    X, n = pc.clip_columns(np.array([[np.nan, 700.0, 0.0, 3.0]]), *np.array(BOUNDS).T)
    assert n == 1 and np.isnan(X[0, 0]) and X[0, 1] == 600.0


def test_budget_is_shared_with_the_algorithm_and_composed_by_the_accountant():
    rng = np.random.default_rng(5)
    centers = rng.uniform(-40, 40, (3, 4)) + [50, 240, 0, 5]
    devs = [centers[rng.integers(0, 3, 400)] + rng.normal(0, 3, (400, 4)) for _ in range(5)]
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=6.0, noise_seed=3)
    pre = FederatedPreprocessor(privacy=dp, bounds=BOUNDS, budget_share=0.25).fit(devs)
    assert pre.privacy_["epsilon"] == 0.25 and pre.privacy_["epsilon_spent"] <= 0.25
    km = DistributedLloyd(3, privacy=dp.after(pre.privacy_plan_), random_state=0).fit(
        pre.transform(devs))
    rec = km.privacy_
    assert rec["releases"][0]["what"] == pc.WHAT     # the preprocessing is listed first
    mults = [(r["noise_multiplier"], r["repeats"]) for r in rec["releases"]]
    total = composed_epsilon(mults, 1e-6)             # every release of the run, recomposed
    assert total <= 1.0 and rec["epsilon_spent"] == pytest.approx(total)
    assert total > 0.99
    # the same algorithm alone would get less noise: the preprocessing took its share
    alone = DistributedLloyd(3, privacy=dp, random_state=0).fit(pre.transform(devs)).privacy_
    assert alone["releases"][-1]["noise_multiplier"] < rec["releases"][-1]["noise_multiplier"]


def test_prior_travels_in_the_protocol_config():
    plan = calibrate(DifferentialPrivacy(0.3, 1e-6), [Release("a", 2.0)])
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=2.0).after(plan)
    cfg = json.loads(json.dumps(dp.to_config()))
    assert DifferentialPrivacy.from_config(cfg) == dp
    proto = PreprocessProtocol(4, privacy=DifferentialPrivacy(0.7, 1e-6, noise_seed=1),
                               lower=[b[0] for b in BOUNDS], upper=[b[1] for b in BOUNDS])
    again = PreprocessProtocol.from_config(json.loads(json.dumps(proto.config())))
    assert again.plan.releases == proto.plan.releases
    np.testing.assert_array_equal(again.lower, proto.lower)


def test_a_noiseless_prior_cannot_enter_a_finite_budget():
    plan = calibrate(DifferentialPrivacy(math.inf, 1e-6), [Release("a", 2.0)])
    with pytest.raises(ValidationError, match="a prior release without noise"):
        calibrate(DifferentialPrivacy(1.0, 1e-6).after(plan), [Release("b", 1.0)])


def test_noise_seed_reproduces():
    devs = sites(6)
    make = lambda s: FederatedPreprocessor(  # noqa: E731
        privacy=DifferentialPrivacy(1.0, 1e-6, noise_seed=s), bounds=BOUNDS).fit(devs)
    a, b, c = make(1), make(1), make(2)
    assert np.array_equal(a.mean_, b.mean_) and not np.array_equal(a.mean_, c.mean_)
    assert (a.var_ > 0).all() and (a.scale_ > 0).all()
    low, high = np.array(BOUNDS).T
    assert ((a.mean_ >= low) & (a.mean_ <= high)).all()


@pytest.mark.parametrize("kwargs,text", [
    ({}, "needs bounds, a public (low, high) range per column"),
    ({"bounds": BOUNDS[:3]}, "bounds has shape (3, 2); the data has 4 columns"),
    ({"bounds": BOUNDS[:3] + [[5.0, 5.0]]}, "bounds of column 'x3' are [5.0, 5.0]"),
    ({"bounds": BOUNDS, "budget_share": 0.0}, "budget_share=0.0 must be a number in (0, 1]"),
    ({"bounds": BOUNDS, "privacy": DifferentialPrivacy(1.0, 1e-6, unit="device",
                                                       clip_norm=1.0)},
     "with unit='device' needs site_rows"),
    ({"bounds": BOUNDS, "site_rows": 0}, "site_rows=0 must be an int >= 1"),
    ({"bounds": BOUNDS, "privacy": "eps=1"}, "must be a fedclust.privacy.DifferentialPrivacy"),
])
def test_bad_private_preprocessing_is_one_line(kwargs, text):
    kwargs = {"privacy": DifferentialPrivacy(1.0, 1e-6), **kwargs}
    with pytest.raises(ValidationError) as exc:
        FederatedPreprocessor(**kwargs).fit(sites(0))
    assert text in str(exc.value) and "\n" not in str(exc.value)


def _config(preprocess, privacy):
    return {"seed": 3,
            "data": {"source": "gaussians", "n_features": 4, "n_clusters": 3,
                     "n_local_clusters": 3, "m0": 4, "separation": 30.0, "n_per_component": 60},
            "algorithm": {"name": "distributed-lloyd", "n_clusters": 3, "max_rounds": 2},
            "preprocess": preprocess, "privacy": privacy, "baselines": {"centralized": False}}


def test_config_privacy_covers_the_preprocessing():
    from fedclust.config import check_config
    from fedclust.experiment import run_experiment
    from fedclust.sites.preprocess import PREPROCESS_BUDGET_SHARE

    cfg = check_config(_config({"bounds": [[-300, 300]] * 4},
                               {"epsilon": 1.0, "delta": 1e-6, "data_bound": 4.0,
                                "noise_seed": 2}))
    exp = run_experiment(cfg)
    pre = exp.result["preprocess"]["privacy"]
    assert pre["epsilon"] == pytest.approx(PREPROCESS_BUDGET_SHARE * 1.0)
    rec = exp.result["privacy"]
    assert rec["releases"][0]["what"] == pc.WHAT
    assert rec["releases"][0]["noise_std"] == pre["releases"][0]["noise_std"]
    total = composed_epsilon([(r["noise_multiplier"], r["repeats"]) for r in rec["releases"]],
                             1e-6)
    assert total <= 1.0 and rec["epsilon_spent"] <= 1.0
    json.dumps(exp.result, allow_nan=False)


def test_config_private_preprocessing_without_bounds_is_one_line():
    from fedclust.config import check_config
    from fedclust.core.exceptions import ConfigError
    from fedclust.experiment import run_experiment

    cfg = check_config(_config({"impute": "mean"}, {"epsilon": 1.0, "delta": 1e-6,
                                                    "data_bound": 4.0}))
    with pytest.raises(ConfigError) as exc:
        run_experiment(cfg)
    assert "[preprocess] needs bounds" in str(exc.value) and "\n" not in str(exc.value)
    cfg = check_config(_config({"bounds": [[-300, 300]] * 4},
                               {"epsilon": 1.0, "delta": 1e-6, "data_bound": 4.0,
                                "unit": "device", "clip_norm": 40.0}))
    with pytest.raises(ConfigError) as exc:
        run_experiment(cfg)
    assert "[preprocess] needs site_rows" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("preprocess,privacy,text", [
    ({"bounds": [[0, 1]] * 4}, {}, "[preprocess] bounds is only used with a [privacy] table"),
    ({"bounds": [[0, 1]] * 4, "budget_share": 1.5}, {"epsilon": 1.0, "delta": 1e-6},
     "[preprocess] budget_share=1.5 must be a number in (0, 1]"),
    ({"bounds": [0, 1]}, {"epsilon": 1.0, "delta": 1e-6},
     "[preprocess] bounds=[0, 1] must be a list of [low, high] pairs"),
])
def test_config_preprocess_privacy_errors(preprocess, privacy, text):
    from fedclust.config import check_config
    from fedclust.core.exceptions import ConfigError

    with pytest.raises(ConfigError) as exc:
        check_config(_config(preprocess, privacy))
    assert text in str(exc.value) and "\n" not in str(exc.value)


def test_released_statistics_stay_inside_the_public_ranges_at_tiny_epsilon():
    """Noise far above the data: the released mean stays in its range, the scale in (0, w]."""
    devs = sites(8, sizes=(20, 15))
    low, high = np.array(BOUNDS).T
    for s in range(5):
        pre = FederatedPreprocessor(privacy=DifferentialPrivacy(0.01, 1e-6, noise_seed=s),
                                    bounds=BOUNDS).fit(devs)
        assert ((pre.mean_ >= low) & (pre.mean_ <= high)).all()
        assert ((pre.scale_ > 0) & (pre.scale_ <= (high - low) / 2)).all()
        assert pre.n_rows_ >= 1 and (pre.n_samples_seen_ >= 1).all()


@pytest.mark.slow
def test_flower_simulation_gives_the_same_private_preprocessing_and_lloyd():
    """Preprocessing, then DP Lloyd after it (with the k-FED init), on both transports."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedclust.flower.transport import FlowerSimulationTransport

    devs = sites(9)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=5.0, noise_seed=4)
    runs = []
    for transport in (None, FlowerSimulationTransport()):
        pre = FederatedPreprocessor(privacy=dp, bounds=BOUNDS, budget_share=0.3).fit(
            devs, transport=transport)
        km = DistributedLloyd(3, rounds=2, privacy=dp.after(pre.privacy_plan_),
                              random_state=1).fit(pre.transform(devs), transport=transport)
        runs.append((pre, km))
    (pa, ka), (pb, kb) = runs
    assert np.array_equal(pa.mean_, pb.mean_) and np.array_equal(pa.scale_, pb.scale_)
    assert np.array_equal(ka.cluster_centers_, kb.cluster_centers_)


def test_device_level_clips_each_site_to_site_rows():
    """unit="device": a site's release vector is scaled to norm site_rows·sqrt(1 + 2.25 d)
    (the sensitivity); means and variances of a site are kept, its weight shrinks."""
    devs = sites(4)
    d = devs[0].shape[1]
    low, high = np.array(BOUNDS).T
    c, w = (low + high) / 2, (high - low) / 2
    dev = DifferentialPrivacy(math.inf, 1e-6, unit="device", clip_norm=1.0)
    # site_rows above every site: nothing clipped, the exact pooled preprocessing bit for bit
    big = FederatedPreprocessor(privacy=dev, bounds=BOUNDS, site_rows=10_000).fit(devs)
    exact = FederatedPreprocessor().fit([pc.clip_columns(X, low, high)[0] for X in devs])
    assert np.array_equal(big.mean_, exact.mean_) and np.array_equal(big.var_, exact.var_)
    # small site_rows: the pooled mean is the f-weighted mean, f computed here by hand
    k = 5
    small = FederatedPreprocessor(privacy=dev, bounds=BOUNDS, site_rows=k).fit(devs)
    num, den = np.zeros(d), np.zeros(d)
    for X in devs:
        Xc = pc.clip_columns(X, low, high)[0]
        ok = ~np.isnan(Xc)
        U = np.where(ok, (Xc - c) / w, 0.0)
        v = np.concatenate([[len(X)], ok.sum(0), U.sum(0), np.where(ok, U ** 2 - 0.5, 0).sum(0)])
        f = min(1.0, k * math.sqrt(1 + 2.25 * d) / np.linalg.norm(v))
        assert f < 1
        num += f * np.where(ok, Xc, 0).sum(0)
        den += f * ok.sum(0)
    assert np.allclose(small.mean_, num / den)
    noisy = FederatedPreprocessor(privacy=DifferentialPrivacy(1.0, 1e-6, unit="device",
                                                              clip_norm=1.0, noise_seed=0),
                                  bounds=BOUNDS, site_rows=k).fit(devs)
    rel = noisy.privacy_["releases"][0]
    assert rel["sensitivity"] == pytest.approx(k * math.sqrt(1 + 2.25 * d))
    assert "device level" in rel["what"]
    assert ((noisy.mean_ >= low) & (noisy.mean_ <= high)).all() and (noisy.var_ > 0).all()


def test_config_site_rows_key():
    from fedclust.config import ConfigError, check_config

    ok = check_config(_config({"bounds": [[-300, 300]] * 4, "site_rows": 50},
                              {"epsilon": 1.0, "delta": 1e-6, "data_bound": 4.0}))
    assert ok["preprocess"]["site_rows"] == 50
    for pre, priv, text in [({"site_rows": 50}, {}, "only used with a [privacy] table"),
                            ({"bounds": [[-300, 300]] * 4, "site_rows": 0},
                             {"epsilon": 1.0, "delta": 1e-6, "data_bound": 4.0},
                             "site_rows=0 must be an int >= 1")]:
        with pytest.raises(ConfigError) as exc:
            check_config(_config(pre, priv))
        assert text in str(exc.value) and "\n" not in str(exc.value)


def test_wrong_number_of_bounds_names_the_columns_in_order():
    cols = ["age", "sex=f", "sex=m", "chol"]  # one-hot columns in place of their column
    with pytest.raises(ValidationError) as exc:
        FederatedPreprocessor(privacy=DifferentialPrivacy(1.0, 1e-6),
                              bounds=BOUNDS[:3]).fit(sites(0), columns=cols)
    assert str(exc.value).endswith("(low, high) per column, in this order: age, sex=f, sex=m, "
                                   "chol")
