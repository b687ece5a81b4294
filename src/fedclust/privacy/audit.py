"""An empirical privacy audit: a statistical lower bound on the ε a fit really spends.

(ε, δ)-DP promises, for neighbouring datasets D and D' and every event E of the
released output, ``P[M(D') ∈ E] ≤ e^ε P[M(D) ∈ E] + δ`` (and the same with D and
D' swapped). An audit fits an estimator many times on D and on D' with fresh
noise, reads every public fitted attribute as a vector of numbers
(:func:`public_statistics`), picks on one half of the fits the threshold event
``{T ≥ t}`` that best separates the two (one coordinate, sum, norm or size of
one attribute), and on the other half bounds both probabilities with
Clopper–Pearson intervals (``scipy.stats.beta``). Then

    ε_lb = log((p̲' − δ) / p̄)

is below the true ε with probability at least 1 − α (p̲' the lower end for the
more likely side, p̄ the upper end for the other). The selection half keeps the
search over many statistics from biasing the bound (Jagielski, Ullman & Oprea,
NeurIPS 2020; Nasr et al., IEEE S&P 2021, for the method). An honest mechanism
gives ε_lb below the accounted ε; a broken one (no noise, an exact count in an
attribute) gives one above it, given enough fits.

The audit only finds leaks in the attributes and events it tries: a bound below
the accounted ε is evidence, not a proof, that the accounting holds.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["public_statistics", "empirical_epsilon", "AuditResult", "audit", "NOT_RELEASED"]

#: fitted attributes that are not releases of the fit: each device's outputs about
#: its own rows, the run's seed and public inputs
NOT_RELEASED = frozenset({"device_labels_", "labels_", "seed_", "seed_device_", "device_ids_",
                          "n_features_in_", "feature_names_in_", "privacy_plan_"})
_MISSING = -1e300   # a coordinate a fit does not have: below every threshold


def _walk(value: Any, key: tuple, out: dict) -> None:
    if value is None or isinstance(value, str):
        return
    if isinstance(value, (bool, np.bool_)):
        out[key] = float(value)
    elif isinstance(value, numbers.Real):
        out[key] = float(value)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            return
        a = np.asarray(value, dtype=np.float64)
        flat = a.ravel()
        for i, v in enumerate(flat):
            out[key + (i,)] = float(v)
        out[key + ("size",)] = float(a.size)
        if a.size:
            finite = flat[np.isfinite(flat)]
            out[key + ("sum",)] = float(finite.sum())
            out[key + ("norm",)] = float(np.linalg.norm(finite))
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            _walk(value[k], key + (str(k),), out)
    elif isinstance(value, (list, tuple)):
        out[key + ("len",)] = float(len(value))
        for i, v in enumerate(value):
            _walk(v, key + (i,), out)


def public_statistics(estimator: Any, skip: Iterable[str] = ()) -> dict[tuple, float]:
    """Every number in the public fitted attributes (``name_``) of ``estimator``, keyed by
    (attribute, path), plus each array's size, sum and norm and each list's length.
    Attributes in :data:`NOT_RELEASED` and ``skip`` are left out."""
    leave = NOT_RELEASED | set(skip)
    out: dict[tuple, float] = {}
    for name in sorted(vars(estimator)):
        if name.startswith("_") or not name.endswith("_") or name in leave:
            continue
        _walk(getattr(estimator, name), (name,), out)
    return out


def _matrix(runs: Sequence[Mapping[tuple, float]], keys: Sequence[tuple]) -> np.ndarray:
    M = np.array([[r.get(k, _MISSING) for k in keys] for r in runs], dtype=np.float64)
    return np.nan_to_num(M, nan=_MISSING / 2, posinf=1e300, neginf=_MISSING)


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _epsilon_of(k_a: int, k_b: int, n: int, delta: float, alpha: float) -> float:
    """ε lower bound from event counts k_a (on one side) and k_b (on the other), both ways."""
    best = 0.0
    for hi_k, lo_k in ((k_a, k_b), (k_b, k_a), (n - k_a, n - k_b), (n - k_b, n - k_a)):
        p_low, _ = _clopper_pearson(hi_k, n, alpha)
        _, q_high = _clopper_pearson(lo_k, n, alpha)
        if p_low - delta > 0 and q_high > 0:
            best = max(best, math.log((p_low - delta) / q_high))
    return best


def empirical_epsilon(runs_d: Sequence[Mapping[tuple, float]],
                      runs_d1: Sequence[Mapping[tuple, float]], delta: float,
                      alpha: float = 0.01) -> tuple[float, tuple]:
    """(ε lower bound, the statistic it used) from fits on D and on D'.

    The first half of each list picks the statistic and threshold; the second
    half is counted. ``alpha``: each Clopper–Pearson interval's error.
    """
    n = min(len(runs_d), len(runs_d1))
    half = n // 2
    keys = sorted(set().union(*runs_d[:n], *runs_d1[:n]), key=str)
    A, B = _matrix(runs_d[:n], keys), _matrix(runs_d1[:n], keys)
    # selection: per statistic, the threshold between the two medians and its separation
    ma, mb = np.median(A[:half], axis=0), np.median(B[:half], axis=0)
    t = (ma + mb) / 2.0
    up = mb >= ma
    sel_a = np.where(up, A[:half] >= t, A[:half] <= t).sum(0)
    sel_b = np.where(up, B[:half] >= t, B[:half] <= t).sum(0)
    score = sel_b - sel_a
    j = int(np.argmax(score))
    ev_a = (A[half:, j] >= t[j]) if up[j] else (A[half:, j] <= t[j])
    ev_b = (B[half:, j] >= t[j]) if up[j] else (B[half:, j] <= t[j])
    m = n - half
    return _epsilon_of(int(ev_a.sum()), int(ev_b.sum()), m, delta, alpha), keys[j]


@dataclass(frozen=True)
class AuditResult:
    """One row of an audit table."""

    estimator: str
    release: str
    epsilon: float          # the accounted ε (``privacy_["epsilon_spent"]``)
    epsilon_lower: float    # the empirical lower bound
    statistic: tuple        # the statistic the bound used
    fits: int               # fits per dataset

    def row(self) -> dict[str, Any]:
        return {"estimator": self.estimator, "release": self.release,
                "accounted_epsilon": self.epsilon, "empirical_lower_bound": self.epsilon_lower,
                "statistic": "/".join(map(str, self.statistic)), "fits": self.fits}


def audit(name: str, release: str, fit: Callable[[Any], Any], data: Any, neighbour: Any,
          fits: int, delta: float, *, skip: Iterable[str] = (), alpha: float = 0.01
          ) -> AuditResult:
    """Fit ``fit(data)`` and ``fit(neighbour)`` ``fits`` times each (fresh noise every
    time) and bound the ε they spend (:func:`empirical_epsilon`)."""
    runs_d, runs_d1, spent = [], [], []
    skip = tuple(skip)
    for _ in range(int(fits)):
        for dataset, runs in ((data, runs_d), (neighbour, runs_d1)):
            est = fit(dataset)
            runs.append(public_statistics(est, skip))
            spent.append(float(est.privacy_["epsilon_spent"]))
    lb, stat = empirical_epsilon(runs_d, runs_d1, delta, alpha)
    return AuditResult(name, release, max(spent), lb, stat, int(fits))
