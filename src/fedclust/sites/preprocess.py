"""Federated preprocessing: mean imputation and standard scaling fitted in one counted round.

A protocol like any other (:class:`PreprocessProtocol`, run by the in-process
transport or by Flower): every site sends, per column, its count of non-missing
values, their sum, and their sum of squared deviations from the site's own mean
(the sum of squares, centred — the same information, without the cancellation
of ``Σx² − n x̄²``), plus its row count. The server pools them exactly (Chan,
Golub & LeVeque's merge) and sends back the pooled mean and scale, ``16 d``
bytes; no site sends a row. Upload per site: ``24 d + 8`` bytes.

The result equals scikit-learn's ``SimpleImputer(strategy="mean")`` followed by
``StandardScaler()`` fitted on the pooled rows: imputed cells equal the pooled
mean, so they add nothing to the centred sum of squares but do count as rows
(the variance divides by the row count). Constant columns get scale 1, as in
scikit-learn.

With ``privacy`` (point level, central DP; :mod:`fedclust.privacy.columns`):
each site clips every value to the user's public per-column range, sends the
same message, and the server adds Gaussian noise once to the pooled row
count, per-column counts, sums and sums of squares before computing the mean
and scale. ε = ∞ gives the non-private result bit for bit.

Summed form (``summed=True``; what ``FederatedPreprocessor(secure_aggregation=True)``
and a transport with secure aggregation run): Chan's merge needs each site's
own mean, so the server could not work from a sum alone. Two rounds whose
replies the server only adds up replace it (:attr:`PreprocessProtocol.summed_actions`,
:mod:`fedclust.core.secure_sum`):

1. ``column_sums`` — per column the non-missing count and sum, the row count
   (:class:`ColumnSums`, ``16 d + 8`` bytes up);
2. ``column_squares`` — the server broadcasts a centre (:class:`ColumnCentre`,
   ``8 d`` bytes down): the pooled mean, or with ``privacy`` the public middle
   of each column's range (so no statistic reaches a site before the noise);
   each site returns the sum over its non-missing values of the squared
   deviations from it, and its row count (:class:`ColumnSquares`, ``8 d + 8``
   bytes up).

Deviations from the pooled mean are small numbers, so their fixed-point sum
keeps its precision (a plain ``Σ x²`` would lose it to ``Σx² − n x̄²``
cancellation). Under secure aggregation the server sees these sums only; with
``privacy`` it adds the same Gaussian noise to them (central DP over the sum).
A site that answers the first round but not the second stops the fit with one
line (the pooled variance would mix different sites).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.checkpoint import privacy_summary
from ..core.exceptions import IncompatibleMessageError, NotFittedError, ValidationError
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog
from ..core.registry import register_protocol
from ..core.validation import check_choice
from ..privacy import DifferentialPrivacy, PrivacyPlan, calibrate, noise_rng, pop_privacy, privacy_config
from ..privacy import columns as pc
from ..privacy.mechanisms import SERVER
from .preprocess_messages import (ColumnCentre, ColumnMoments, ColumnSquares, ColumnSums,
                                  PooledTransform)

__all__ = ["FederatedPreprocessor", "PreprocessProtocol", "PreprocessResult", "ColumnMoments",
           "PooledTransform", "IMPUTE", "SCALE", "PREPROCESS_BUDGET_SHARE",
           "check_no_missing"]

IMPUTE = ("mean", "none")
SCALE = ("standard", "none")
#: share of the [privacy] ε that a private preprocessing round gets by default: one
#: release of pooled column statistics (noise / all rows) beside the algorithm\'s several
PREPROCESS_BUDGET_SHARE = 0.2
ACTION = "column_moments"
SUMS = "column_sums"        # summed form, round 0
SQUARES = "column_squares"  # summed form, round 1


@dataclass
class PreprocessResult:
    """Pooled statistics: ``mean`` and ``var`` (over the imputed rows), ``scale``, counts."""

    mean: np.ndarray
    var: np.ndarray
    scale: np.ndarray
    count: np.ndarray
    n_rows: int
    log: RunLog = field(default_factory=RunLog)


@dataclass
class _State:
    device_ids: tuple[int, ...]
    done: bool = False
    replies: dict[int, ColumnMoments] = field(default_factory=dict)
    sums: ColumnSums | None = None      # summed form: round 0's pooled sums
    centre: np.ndarray | None = None    # summed form: round 1's broadcast centre
    sq: np.ndarray | None = None        # summed form: round 1's pooled squares


def _add(replies: Mapping[int, Message], cls: type[Message]) -> Message:
    """Field-by-field sum of the replies (a secure sum is already one)."""
    reps = [replies[z] for z in sorted(replies)]
    return cls(**{f: np.sum([getattr(r, f) for r in reps], axis=0) for f in cls.schema})


def _where(names: Sequence[str], z: int) -> str:
    return names[z] if 0 <= z < len(names) else f"device {z}"


def _column(columns: Sequence[str], j: int) -> str:
    return repr(columns[j]) if j < len(columns) else str(j)


def check_no_missing(X: np.ndarray, where: str, columns: Sequence[str] = ()) -> None:
    """Raise naming the site, row and column of the first NaN (``impute="none"``)."""
    bad = np.isnan(X)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValidationError(f"{where}: row {i}, column {_column(columns, j)} is missing and "
                              "impute='none'; use impute='mean' or fill the value")


class PreprocessProtocol(Protocol):
    """One round: column moments up, the pooled transform down; or, with ``summed``,
    two rounds of plain sums (see the module docstring)."""

    name = "preprocess"
    reply_types = {ACTION: ColumnMoments, SUMS: ColumnSums, SQUARES: ColumnSquares}
    not_summable_reason = ("its one-round column moments are pooled by Chan's merge; "
                           "FederatedPreprocessor(secure_aggregation=True) sends plain sums")

    def __init__(self, n_features: int, *, impute: str = "mean", scale: str = "standard",
                 columns: Sequence[str] = (), names: Sequence[str] = (),
                 privacy: DifferentialPrivacy | None = None, lower: Sequence[float] = (),
                 upper: Sequence[float] = (), site_rows: int | None = None,
                 summed: bool = False):
        self.n_features = int(n_features)
        self.summed = bool(summed)
        if self.summed:
            self.summed_actions = frozenset({SUMS, SQUARES})
        self.impute = check_choice(impute, "impute", IMPUTE)
        self.scale = check_choice(scale, "scale", SCALE)
        self.columns = [str(c) for c in columns]
        self.names = [str(n) for n in names]
        self.privacy = privacy
        self.plan: PrivacyPlan | None = None
        self.site_rows = None if site_rows is None else pc.check_site_rows(site_rows)
        if privacy is not None:
            if privacy.unit == "device" and self.site_rows is None:
                raise ValidationError(
                    "privacy: FederatedPreprocessor with unit='device' needs site_rows (the most "
                    "rows one site may weigh in the pooled statistics, a public number); got None")
            if privacy.unit == "device" and self.summed:
                raise ValidationError(
                    "privacy: FederatedPreprocessor with unit='device' scales each site's "
                    "moments on the server, which secure aggregation hides; use "
                    "secure_aggregation=False or unit='point'")
            bounds = np.column_stack([lower, upper]) if len(lower) else None
            self.lower, self.upper = pc.column_ranges(bounds, self.n_features, self.columns)
            self.plan = calibrate(privacy, [pc.column_moments_release(
                self.n_features, self.site_rows if privacy.unit == "device" else None)],
                family="the preprocessing")

    def config(self) -> dict[str, Any]:
        cfg = {"n_features": self.n_features, "impute": self.impute, "scale": self.scale,
               "columns": list(self.columns), "names": list(self.names)}
        if self.privacy is not None:
            cfg.update(privacy_config(self.privacy))
            cfg.update(lower=self.lower.tolist(), upper=self.upper.tolist())
        if self.site_rows is not None:
            cfg["site_rows"] = self.site_rows
        if self.summed:
            cfg["summed"] = True
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "PreprocessProtocol":
        cfg = dict(config)
        privacy = pop_privacy(cfg)
        if privacy is not None:
            cfg["privacy"] = privacy
        return cls(cfg.pop("n_features"), **cfg)

    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(int(z) for z in device_ids))

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a fit asks of each device, by action: the moments at once, or
        the sums then the squares about their centre."""
        return {SUMS: 1, SQUARES: 1} if self.summed else {ACTION: 1}

    def next_request(self, state: _State) -> Request | None:
        if state.done:
            return None
        if not self.summed:
            return Request(round=0, action=ACTION)
        if state.sums is None:
            return Request(round=0, action=SUMS)
        return Request(round=1, action=SQUARES, payload=ColumnCentre(centre=state.centre))

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        d = (reply.sq if request.action == SQUARES else reply.count).shape[0]
        if d != self.n_features:
            raise IncompatibleMessageError(
                f"{_where(self.names, device_id)}: sent {d} columns, "
                f"the federation has {self.n_features}")

    def server_step(self, state: _State, request: Request,
                    replies: Mapping[int, Message]) -> None:
        if request.action == SUMS:
            state.sums = _add(replies, ColumnSums)
            count = state.sums.count
            self._check_columns(count)
            # with privacy the centre is public (the middle of each range): no statistic
            # reaches a site before the noise; without, the pooled mean
            state.centre = ((self.lower + self.upper) / 2.0 if self.privacy is not None
                            else state.sums.total / count)
            return
        if request.action == SQUARES:
            squares = _add(replies, ColumnSquares)
            if int(squares.n_rows) != int(state.sums.n_rows):
                raise ValidationError(
                    f"round {request.round}: the squared deviations cover "
                    f"{int(squares.n_rows)} rows but the sums covered "
                    f"{int(state.sums.n_rows)}; a site answered one round only, so the "
                    "pooled variance would mix different sites")
            state.sq = squares.sq
        else:
            state.replies.update(replies)
        state.done = True

    def _check_columns(self, count: np.ndarray) -> None:
        empty = np.flatnonzero(count == 0)
        if empty.size:
            raise ValidationError(f"column {_column(self.columns, empty[0])} has no value at any "
                                  "site; drop it from the features")

    def _pooled(self, state: _State) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, count, total, m2 about the pooled mean) over the replying sites."""
        if self.summed:
            s = state.sums
            count, total = s.count.astype(np.int64), np.asarray(s.total, np.float64)
            mean = total / count
            # Σ (x - m)^2 = Σ (x - c)^2 - n (m - c)^2; c = m without privacy
            m2 = np.maximum(state.sq - count * (mean - state.centre) ** 2, 0.0)
            return int(s.n_rows), count, total, m2
        reps = [state.replies[z] for z in sorted(state.replies)]
        if self.privacy is not None and self.privacy.unit == "device":
            reps = pc.clip_sites(reps, self.lower, self.upper, self.site_rows)
        count = np.sum([r.count for r in reps], axis=0)
        count = count.astype(np.int64) if count.dtype.kind in "iu" else count
        n_rows = sum(r.n_rows for r in reps)
        n_rows = int(n_rows) if np.asarray(n_rows).dtype.kind in "iu" else float(n_rows)
        total = np.sum([r.total for r in reps], axis=0)
        self._check_columns(count)
        mean = total / count
        # Chan et al.: M2 = sum_z [M2_z + n_z (mean_z - mean)^2], exact pooling
        m2 = np.zeros_like(mean)
        for r in reps:
            n = r.count
            mz = np.divide(r.total, n, out=np.zeros_like(mean), where=n > 0)
            m2 += r.m2 + n * (mz - mean) ** 2
        return n_rows, count, total, m2

    def finish(self, state: _State, log: RunLog) -> PreprocessResult:
        n_rows, count, total, m2 = self._pooled(state)
        mean = state.centre if self.summed and self.privacy is None else total / count
        var = m2 / n_rows  # imputed cells sit at the mean: rows count, deviations do not
        if self.plan is not None and self.privacy.private:
            std = self.plan.releases[0].noise_std
            rel = pc.noisy_column_moments(n_rows, count, total, m2, self.lower, self.upper, std,
                                          noise_rng(self.privacy.noise_seed, SERVER,
                                                    pc.PREPROCESS_STREAM))
            mean, var, count, n_rows = rel["mean"], rel["var"], rel["count"], rel["n_rows"]
        elif not isinstance(n_rows, int):   # ε = ∞ with clipped sites: weighted rows
            count, n_rows = np.rint(count).astype(np.int64), int(round(n_rows))
        scale = np.ones_like(mean)
        if self.scale == "standard":
            eps = np.finfo(np.float64).eps
            # scikit-learn's test for a constant column (rounding noise of a variance)
            constant = var <= n_rows * eps * var + (n_rows * mean * eps) ** 2
            scale = np.where(constant, 1.0, np.sqrt(var))
        return PreprocessResult(mean, var, scale, count, n_rows, log)

    def final_message(self, result: PreprocessResult, device_id: int) -> Message:
        return PooledTransform(mean=result.mean, scale=result.scale)

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> ColumnMoments:
        X = np.asarray(X[0] if isinstance(X, tuple) else X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValidationError(f"{_where(self.names, device_id)}: data of shape {X.shape}; "
                                  f"expected {self.n_features} columns")
        if len(X) == 0:
            raise ValidationError(f"{_where(self.names, device_id)}: no rows")
        if self.impute == "none":
            check_no_missing(X, _where(self.names, device_id), self.columns)
        if self.privacy is not None:
            X, n_clipped = pc.clip_columns(X, self.lower, self.upper)
            state["n_clipped"] = np.asarray(n_clipped, dtype=np.int64)
        ok = ~np.isnan(X)
        if request.action == SQUARES:
            c = request.payload.centre if request.payload is not None else None
            if c is None or c.shape != (X.shape[1],) or not np.isfinite(c).all():
                raise ValidationError(f"{_where(self.names, device_id)}: the centre of round "
                                      f"{request.round} must be {X.shape[1]} finite numbers")
            sq = np.where(ok, (X - c) ** 2, 0.0).sum(axis=0)
            return ColumnSquares(sq=sq, n_rows=np.asarray(len(X), np.int64))
        count = ok.sum(axis=0)
        total = np.where(ok, X, 0.0).sum(axis=0)
        if request.action == SUMS:
            return ColumnSums(count=count.astype(np.int64), total=total,
                              n_rows=np.asarray(len(X), np.int64))
        mz = np.divide(total, count, out=np.zeros(X.shape[1]), where=count > 0)
        m2 = np.where(ok, (X - mz) ** 2, 0.0).sum(axis=0)
        return ColumnMoments(count=count.astype(np.int64), total=total, m2=m2,
                             n_rows=np.asarray(len(X), np.int64))

    def client_finish(self, message: Message | None, X: Any,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"n_clipped": state["n_clipped"]} if "n_clipped" in state else {}


class FederatedPreprocessor:
    """Mean imputation + standard scaling fitted on a federation without moving a row.

    Parameters
    ----------
    impute : {"mean", "none"}, default="mean"
        ``"mean"``: a missing value becomes the pooled column mean; ``"none"``: a
        missing value is an error naming the site, row and column.
    scale : {"standard", "none"}, default="standard"
        ``"standard"``: subtract the pooled mean, divide by the pooled standard
        deviation (population, over the imputed rows), as ``StandardScaler``.
    privacy : DifferentialPrivacy or None, default=None
        Point-level (ε, δ)-DP for the released mean, variance and counts
        (central: the server adds Gaussian noise once to the pooled
        statistics; the sites trust it with their exact column moments, as
        without privacy). ``unit="device"`` (one whole site) needs ``site_rows``.
        See ``docs/privacy.md``.
    bounds : array-like (d, 2), optional
        Public (low, high) range of every column, needed with ``privacy``:
        each value outside it is clipped on its site (the site counts them in its own ``n_clipped``
        output; no count is released). It is the user's: DP never reads the data to
        set it. Not used without privacy.
    site_rows : int, optional
        ``unit="device"``: the most rows one site may weigh. The server scales a
        site's whole statistics vector (rows, counts, sums, sums of squares, in
        range units) down to the norm of ``site_rows`` rows with every column at
        its range's edge, so one site moves the release by at most that much
        (the sensitivity); a larger site keeps its means and variances but
        counts as fewer rows in the pooled ones. A public number, not read from
        the data.
    budget_share : float in (0, 1], default=1.0
        Fraction of ``privacy.epsilon`` this release is calibrated to. Below 1
        the rest is left for the algorithm fitted next: pass it
        ``privacy.after(preprocessor.privacy_plan_)``, and the accountant
        composes both fits within the total ``privacy.epsilon``.
    secure_aggregation : bool or SecureAggregation, default=False
        Fit with two rounds of plain sums (counts and sums, then squared
        deviations from the pooled mean) run as secure sums
        (:mod:`fedclust.core.secure_sum`): the server learns the pooled sums,
        never one site's. Equal to scikit-learn's pooled fit within the
        fixed-point precision (``2**-frac_bits`` per site and value). A
        transport with secure aggregation on turns it on too. Each secure round
        costs 3 extra exchanges.
    progress : bool, default=False
        Progress bar of the default in-process transport.

    Attributes
    ----------
    mean_, var_, scale_ : ndarray (d,)
        Pooled mean, variance and scale (1 where a column is constant or ``scale="none"``).
    n_samples_seen_ : ndarray (d,)
        Non-missing values per column over all sites.
    n_rows_ : int
    feature_names_in_ : list of str
    communication_ : dict
        Byte counts: ``24 d + 8`` up and ``16 d`` down per site; summed
        (secure aggregation) ``24 d + 16`` up and ``24 d`` down plus the secure
        stages' keys, shares and masked vectors.
    privacy_ : dict or None
        With ``privacy``: budget, the release with its noise scale, and the
        clipped values per site.
    privacy_plan_ : PrivacyPlan or None
        The calibrated release, for :meth:`DifferentialPrivacy.after`.

    Notes
    -----
    Equal to ``make_pipeline(SimpleImputer(strategy="mean"), StandardScaler())``
    fitted on the pooled rows (up to float rounding). Server work O(Z d).
    """

    def __init__(self, impute: str = "mean", scale: str = "standard", *,
                 privacy: DifferentialPrivacy | None = None, bounds: Any = None,
                 budget_share: float = 1.0, site_rows: int | None = None,
                 secure_aggregation: Any = False,
                 progress: bool = False):
        self.impute = impute
        self.site_rows = site_rows
        self.scale = scale
        self.privacy = privacy
        self.bounds = bounds
        self.budget_share = budget_share
        self.secure_aggregation = secure_aggregation
        self.progress = progress

    def _protocol_privacy(self, d: int, cols: Sequence[str]) -> dict[str, Any]:
        if self.privacy is None:
            return {}
        if not isinstance(self.privacy, DifferentialPrivacy):
            raise ValidationError(f"privacy={self.privacy!r} must be a "
                                  "fedclust.privacy.DifferentialPrivacy or None")
        share = self.budget_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValidationError(f"budget_share={share!r} must be a number in (0, 1]")
        spec = self.privacy if share == 1 else replace(self.privacy,
                                                        epsilon=self.privacy.epsilon * share)
        low, high = pc.column_ranges(self.bounds, d, cols)
        return {"privacy": spec, "lower": low.tolist(), "upper": high.tolist(),
                "site_rows": self.site_rows}

    def fit(self, devices: Sequence[Any], y: None = None, *, columns: Sequence[str] | None = None,
            names: Sequence[str] | None = None, transport: Any = None) -> "FederatedPreprocessor":
        """Run the round over ``devices``: a list of (n_z, d) arrays (NaN = missing), or a
        :class:`~fedclust.sites.SiteFederation` (its columns and site names then name errors)."""
        from ..sim.transport import fit_transport

        if hasattr(devices, "devices") and hasattr(devices, "names"):  # a SiteFederation
            columns = devices.columns if columns is None else columns
            names = devices.names if names is None else names
            devices = devices.devices

        check_choice(self.impute, "impute", IMPUTE)
        check_choice(self.scale, "scale", SCALE)
        if isinstance(devices, np.ndarray):
            raise ValidationError("devices must be a list of per-site 2-D arrays; wrap one "
                                  "array as [X]")
        Xs = [np.asarray(X, dtype=np.float64) for X in devices]
        if not Xs:
            raise ValidationError("devices is empty")
        d = Xs[0].shape[1] if Xs[0].ndim == 2 else -1
        for z, X in enumerate(Xs):
            if X.ndim != 2 or X.shape[1] != d:
                raise ValidationError(f"device {z}: shape {X.shape}; every site needs 2-D data "
                                      f"with {d} columns")
        cols = [str(c) for c in columns] if columns is not None else [f"x{j}" for j in range(d)]
        transport = fit_transport(transport, self.secure_aggregation, self.progress)
        protocol = PreprocessProtocol(d, impute=self.impute, scale=self.scale, columns=cols,
                                      names=list(names or []),
                                      summed=bool(getattr(transport, "secure_aggregation", False)),
                                      **self._protocol_privacy(d, cols))
        out = transport.run(protocol, dict(enumerate(Xs)), 0)
        res: PreprocessResult = out.result
        self._set(res.mean, res.var, res.scale, res.count, res.n_rows, cols)
        self.communication_ = out.meter.summary()
        self.run_log_ = out.log
        self.privacy_plan_ = protocol.plan
        self.privacy_ = None
        if protocol.plan is not None:
            self.privacy_ = privacy_summary(protocol.plan, out.log)  # lost releases count
            self.privacy_["budget_share"] = float(self.budget_share)
        return self

    def _set(self, mean, var, scale, count, n_rows, cols) -> None:
        self.mean_ = np.asarray(mean, np.float64)
        self.var_ = np.asarray(var, np.float64)
        self.scale_ = np.asarray(scale, np.float64)
        self.n_samples_seen_ = np.asarray(count, np.int64)
        self.n_rows_ = int(n_rows)
        self.n_features_in_ = len(self.mean_)
        self.feature_names_in_ = list(cols)

    def transform(self, X: Any, *, where: str = "X") -> Any:
        """Impute and scale one (n, d) array, or each array of a list (a federation)."""
        if not hasattr(self, "mean_"):
            raise NotFittedError("this FederatedPreprocessor is not fitted yet; call fit first")
        if hasattr(X, "devices") and hasattr(X, "names"):  # a SiteFederation
            return [self.transform(Xz, where=p) for Xz, p in zip(X.devices, X.paths)]
        if isinstance(X, (list, tuple)):
            return [self.transform(Xz, where=f"device {z}") for z, Xz in enumerate(X)]
        X = np.array(X, dtype=np.float64)  # a copy: the caller's array is left alone
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValidationError(f"{where}: shape {X.shape}; the preprocessing was fitted on "
                                  f"{self.n_features_in_} columns")
        miss = np.isnan(X)
        if miss.any():
            if self.impute == "none":
                check_no_missing(X, where, self.feature_names_in_)
            X[miss] = np.broadcast_to(self.mean_, X.shape)[miss]
        if self.scale == "standard":
            X -= self.mean_
            X /= self.scale_
        return X

    def fit_transform(self, devices: Sequence[Any], y: None = None, **kw: Any) -> list[np.ndarray]:
        return self.fit(devices, **kw).transform(list(devices))

    # -- saved with a model (no pickle) --------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean_, "var": self.var_, "scale": self.scale_,
                "count": self.n_samples_seen_, "n_rows": np.asarray(self.n_rows_, np.int64)}

    def to_json(self) -> dict[str, Any]:
        return {"impute": self.impute, "scale": self.scale, "columns": self.feature_names_in_}

    @classmethod
    def from_saved(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
                   ) -> "FederatedPreprocessor":
        pre = cls(impute=meta["impute"], scale=meta["scale"])
        pre._set(arrays["mean"], arrays["var"], arrays["scale"], arrays["count"],
                 int(arrays["n_rows"]), meta["columns"])
        return pre


register_protocol(PreprocessProtocol, PreprocessResult)
