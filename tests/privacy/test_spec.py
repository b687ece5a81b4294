"""The privacy request: its checks name the bad field, prior releases are read and
composed as documented, and the config round trip keeps everything."""

from __future__ import annotations

import math

import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.privacy import DifferentialPrivacy, Release, calibrate


@pytest.mark.parametrize("kwargs,text", [
    (dict(epsilon=0.0, delta=1e-6), "privacy: epsilon=0.0 must be > 0 (math.inf for no privacy)"),
    (dict(epsilon=1.0, delta="x"), "privacy: delta='x' must be a real number"),
    (dict(epsilon=1.0, delta=1e-6, clip_norm=0.0), "privacy: clip_norm=0.0 must be a finite "
                                                   "number > 0"),
    (dict(epsilon=1.0, delta=1e-6, clip_norm="2"), "privacy: clip_norm='2' must be a real "
                                                   "number"),
    (dict(epsilon=1.0, delta=1e-6, noise_seed=-1), "privacy: noise_seed=-1 must be an int >= 0"),
    (dict(epsilon=1.0, delta=1e-6, noise_seed=1.5), "privacy: noise_seed=1.5 must be an int"),
    (dict(epsilon=1.0, delta=1e-6, noise_seed=True), "privacy: noise_seed=True must be an int"),
])
def test_bad_fields_are_named(kwargs, text):
    with pytest.raises(ValidationError) as exc:
        DifferentialPrivacy(**kwargs)
    assert str(exc.value).startswith(text)


def test_prior_releases_are_read_with_their_sampling():
    dp = DifferentialPrivacy(1.0, 1e-6, prior=[("a", 2, 3, 1.5), ("b", 1.0, 1, 2.0, 0.25),
                                               ("c", 1.0, 1, 2.0, 1.0)])
    assert dp.prior == (("a", 2.0, 3, 1.5, 1.0), ("b", 1.0, 1, 2.0, 0.25),
                        ("c", 1.0, 1, 2.0, 1.0))
    for bad in [("a", 1.0, 1, 2.0, 0.0), ("a", 1.0, 1, 2.0, 1.5), ("a", 1.0, 1, 2.0, 0.5, 9),
                ("a", 1.0), ("a", "x", 1, 2.0)]:
        with pytest.raises(ValidationError) as exc:
            DifferentialPrivacy(1.0, 1e-6, prior=[bad])
        assert str(exc.value) == (f"privacy: prior release {bad!r} must be (what, sensitivity, "
                                  "repeats, noise multiplier[, sampling in (0, 1]])")


def test_after_adds_the_plan_to_the_prior_and_the_config_keeps_it():
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=1.0, prior=[("p", 1.0, 1, 3.0)])
    plan = calibrate(dp, [Release("x", 1.0, 2)])
    later = dp.after(plan)
    (x,) = plan.releases
    assert later.prior == (("p", 1.0, 1, 3.0, 1.0),
                           ("x", 1.0, 2, x.noise_multiplier, 1.0))
    assert later.epsilon == 2.0 and later.data_bound == 1.0
    back = DifferentialPrivacy.from_config(later.to_config())
    assert back == later
    inf = DifferentialPrivacy(math.inf, 1e-6, clip_norm=2.0, noise_seed=4)
    assert inf.to_config()["epsilon"] == "inf"
    assert DifferentialPrivacy.from_config(inf.to_config()) == inf
    assert DifferentialPrivacy.from_config({**inf.to_config(), "epsilon": "Infinity"}) == inf


def test_from_config_names_unknown_and_missing_keys():
    with pytest.raises(ValidationError, match=r"^privacy: epsilon and delta are required$"):
        DifferentialPrivacy.from_config({"epsilon": 1.0})
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['bound'\]"):
        DifferentialPrivacy.from_config({"epsilon": 1.0, "delta": 1e-6, "bound": 2})


def test_require_names_the_missing_bound():
    dp = DifferentialPrivacy(1.0, 1e-6, unit="device")
    with pytest.raises(ValidationError) as exc:
        dp.require(data_bound=True)
    assert str(exc.value) == ("privacy: this estimator needs data_bound (the norm every point "
                              "is clipped to); got None")
    with pytest.raises(ValidationError) as exc:
        dp.require(clip_norm=True, family="X")
    assert str(exc.value) == ("privacy: X with unit='device' needs clip_norm (the bound on one "
                              "device's contribution); got None")


def test_plan_summary_reports_the_request_and_each_release():
    from fedclust.privacy.accounting import planned

    spec = DifferentialPrivacy(2.0, 1e-6, data_bound=3.5, clip_norm=0.75, noise_seed=4)
    plan = calibrate(spec, [Release("sums", 2.0, repeats=3),
                            Release("sampled", 1.0, sampling=0.5)])
    s = plan.summary()
    assert (s["epsilon"], s["delta"], s["unit"], s["accountant"]) == (2.0, 1e-6, "point", "pld")
    assert (s["data_bound"], s["clip_norm"], s["noise_seeded"]) == (3.5, 0.75, True)
    assert 0 < s["epsilon_spent"] <= 2.0
    full, sampled = s["releases"]
    assert "sampling" not in full and sampled["sampling"] == 0.5
    assert full["noise_std"] == pytest.approx(2.0 * full["noise_multiplier"])
    assert full["repeats"] == 3 and full["what"] == "sums"
    assert plan.release("samp") is plan.releases[1]
    with pytest.raises(KeyError, match="counts"):
        plan.release("counts")
    unseeded = calibrate(DifferentialPrivacy(2.0, 1e-6), [Release("sums", 1.0)]).summary()
    assert unseeded["noise_seeded"] is False
    assert unseeded["data_bound"] is None and unseeded["clip_norm"] is None
    with pytest.raises(ValidationError, match=r"^privacy: this fit was given a release "
                                              r"without noise at epsilon=2$"):
        planned(spec, [Release("sums", 1.0)], [0.0])


def test_planned_from_config_multipliers_composes_them_as_given():
    from fedclust.privacy.accounting import composed_epsilon, planned

    rels = [Release("a", 1.0, repeats=2), Release("unused", 1.0, repeats=0)]
    for accountant in ("pld", "rdp"):
        spec = DifferentialPrivacy(5.0, 1e-6, accountant=accountant)
        plan = planned(spec, rels, [0.75, 0.0])    # below 1, and a release never made
        assert [r.noise_multiplier for r in plan.releases] == [0.75, 0.0]
        assert plan.epsilon_spent == composed_epsilon([(0.75, 2)], 1e-6, accountant)
    assert composed_epsilon([(0.75, 2)], 1e-6, "rdp") != composed_epsilon([(0.75, 2)], 1e-6)
    free = planned(DifferentialPrivacy(math.inf, 1e-6), rels, [0.0, 0.0])
    assert free.epsilon_spent == 0.0 and isinstance(free.epsilon_spent, float)
    with pytest.raises(ValidationError, match=r"^privacy: epsilon=0\.001 is too small for the 2 "
                                              r"releases of my fit "):
        planned(DifferentialPrivacy(1e-3, 1e-6), rels, family="my fit")


def test_a_missing_accountant_says_what_to_install(monkeypatch):
    import sys

    from fedclust.privacy.accounting import composed_epsilon

    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(ImportError, match=r"^differential privacy needs the accountant: pip "
                                          r"install 'fedclust\[privacy\]' \(dp-accounting\)$"):
        composed_epsilon([(3.21, 1)], 1e-6)


@pytest.mark.parametrize("bad", [dict(sensitivity=0.0), dict(sensitivity=math.inf),
                                 dict(repeats=-1), dict(share=0.0), dict(sampling=0.0),
                                 dict(sampling=1.5)])
def test_calibrate_refuses_a_bad_release_declaration(bad):
    rel = Release(**{"what": "sums", "sensitivity": 1.0, **bad})
    with pytest.raises(ValidationError, match=r"^privacy: bad release declaration Release\("):
        calibrate(DifferentialPrivacy(1.0, 1e-6), [rel])


def test_calibrate_names_this_fit_when_the_budget_is_too_small():
    with pytest.raises(ValidationError, match=r"^privacy: epsilon=0\.001 is too small for the 3 "
                                              r"releases of this fit \(the noise would exceed "):
        calibrate(DifferentialPrivacy(1e-3, 1e-6), [Release("sums", 1.0, repeats=3)])


def test_a_prior_below_multiplier_one_is_composed_and_unused_releases_are_free():
    from fedclust.privacy.accounting import composed_epsilon

    spec = DifferentialPrivacy(30.0, 1e-6, prior=[("p", 1.0, 2, 0.9)])
    prior_eps = composed_epsilon([(0.9, 2)], 1e-6)
    plan = calibrate(spec, [Release("x", 1.0), Release("unused", 1.0, repeats=0)])
    (x, unused) = plan.releases
    assert plan.epsilon_spent == composed_epsilon([(0.9, 2), (x.noise_multiplier, 1)], 1e-6)
    assert prior_eps < plan.epsilon_spent <= 30.0
    only_prior = calibrate(spec, [])
    assert only_prior.epsilon_spent == prior_eps
