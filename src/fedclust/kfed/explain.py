"""k-FED's warning that its one-shot answer is likely poor, worked out from what the server
already holds: the device centers (pieces), their counts and scatters, the final centers and
each piece's final label.

Each final center's pieces are a weighted set whose k-means cost about their mean is exact
from the summaries (scatter plus count times squared distance). Two checks:

* **A cheaper answer with the same k.** Move every final center to the mean of its
  pieces; or split one final center's pieces in two (a weighted 2-means on the pieces) and
  remove another center, merging its pieces into the nearest remaining group (or one of
  the halves). Each is another k-center answer, built from the same pieces, whose cost is
  exact; any k-center answer costs at least the optimal one. When
  the answer costs more than :data:`POOR_ANSWER_RATIO` times the best such move, it is at
  least that far from the optimum (on the pieces): the server merged two groups and spent a
  center elsewhere, or stopped before its centers settled, the failures of a
  farthest-first start with one Lloyd step.
* **One center holding several groups.** A split's gain, ``n1 n2 / n ‖m1 − m2‖²``, is the
  same partition's gain in the projection on u = m1 − m2, and a 2-partition of a 1-D
  symmetric unimodal group removes at most 3/4 of its cost there (the uniform's value;
  ``Var X ≤ 4/3 (E|X|)²``). So a center whose best split removes more than
  :data:`ONE_GROUP_SPLIT_SHARE` of its cost along u (counted high: each piece's whole
  scatter) holds more than one group. It is reported when that split would also cut the
  whole answer's cost by more than ``POOR_ANSWER_RATIO - 1`` (k is likely too small for
  the data).

Neither depends on how finely the devices cut their data: a piece-level split is a split of
the points, so finer pieces only bring the measured gains closer to the points' own; the
thresholds are bounds on the points, not on piece radii. Cost: per final center an
eigendecomposition of its pieces' d × d scatter and a few 2-means steps over its pieces,
O(Σ k_z d (d + steps) + k (d³ + k² + k d)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["CenterSplit", "center_split", "poor_answer", "surely_quiet", "split_bound",
           "explanation_warning",
           "POOR_ANSWER_RATIO", "ONE_GROUP_SPLIT_SHARE", "QUIET_RTOL"]

#: the warning fires when the answer costs more than this times a k-center answer built
#: from the same pieces (the tolerance a one-shot answer is held to: 10 % above pooled
#: k-means; a good answer, within 5 % of it, cannot be this far above any k-center answer)
POOR_ANSWER_RATIO = 1.10
#: ... or when one center's best split removes more than this share of its cost along the
#: split's direction (more than a split of any symmetric unimodal group can) and more than
#: POOR_ANSWER_RATIO - 1 of the whole cost
ONE_GROUP_SPLIT_SHARE = 0.75
#: 2-means steps on a center's pieces after the best cut along their principal axis
SPLIT_STEPS = 10


@dataclass
class CenterSplit:
    """One final center's pieces: total weight ``n``, mean ``mean`` (d,), cost ``cost``
    about that mean, and their best found split in two: weights ``halves`` (2,), means
    ``half_means`` (2, d) and the cost it removes, ``gain`` (0 for fewer than 2 pieces)."""

    n: float
    mean: np.ndarray
    cost: float
    halves: np.ndarray
    half_means: np.ndarray
    gain: float
    #: the cost along the split's direction u = the halves' mean difference, at most:
    #: ``Σ n_i (u·(c_i − mean))² + Σ S_i`` (the pieces' own scatter counted in full)
    along: float = 0.0


def center_split(C: np.ndarray, w: np.ndarray, S: np.ndarray) -> CenterSplit:
    """The summary and best split of one final center's pieces: centers ``C`` (m, d),
    weights ``w`` (m,) and scatters ``S`` (m,), m ≥ 1, float64. The split: the best cut of
    the pieces sorted along their weighted principal axis, then up to :data:`SPLIT_STEPS`
    weighted 2-means steps; deterministic (the same rows in the same order give the same
    bits)."""
    n = float(w.sum())
    wc = C * w[:, None]
    tot = wc.sum(axis=0)
    mean = tot / n
    D = C - mean
    cost = float(np.maximum(S, 0.0).sum() + (w * (D * D).sum(axis=1)).sum())
    none = CenterSplit(n, mean, cost, np.array([n, 0.0]), np.stack([mean, mean]), 0.0)
    if len(C) < 2:
        return none
    axis = np.linalg.eigh((D * w[:, None]).T @ D)[1][:, -1]
    order = np.argsort((D * axis).sum(axis=1), kind="stable")
    n1 = np.cumsum(w[order])[:-1]
    s1 = np.cumsum(wc[order], axis=0)[:-1]
    n2 = n - n1
    ok = (n1 > 0) & (n2 > 0)
    if not ok.any():
        return none
    with np.errstate(divide="ignore", invalid="ignore"):
        g = n1 * n2 / n * ((s1 / n1[:, None] - (tot - s1) / n2[:, None]) ** 2).sum(axis=1)
    g = np.where(ok, g, -np.inf)
    side = np.zeros(len(C), bool)
    side[order[:int(np.argmax(g)) + 1]] = True
    for _ in range(SPLIT_STEPS):
        m1 = wc[side].sum(axis=0) / w[side].sum()
        m2 = wc[~side].sum(axis=0) / w[~side].sum()
        # nearer m1 than m2: (c − (m1 + m2) / 2) · (m1 − m2) >= 0, one pass over the pieces
        new = ((C - (m1 + m2) / 2) * (m1 - m2)).sum(axis=1) >= 0
        if new.all() or not new.any() or np.array_equal(new, side):
            break
        side = new
    h = np.array([w[side].sum(), w[~side].sum()])
    hm = np.stack([wc[side].sum(axis=0) / h[0], wc[~side].sum(axis=0) / h[1]])
    diff = hm[0] - hm[1]
    gain = float(h[0] * h[1] / n * (diff ** 2).sum())
    u2 = float((diff ** 2).sum())
    # projections on the unit direction: squares of lengths (a fourth power overflows at
    # data near the scale check's limit)
    along = float(np.maximum(S, 0.0).sum()
                  + (w * ((D * (diff / np.sqrt(u2))).sum(axis=1)) ** 2).sum()) \
        if u2 > 0 else cost
    return CenterSplit(n, mean, cost, h, hm, gain, along)


def poor_answer(splits: Sequence[CenterSplit | None],
                final: np.ndarray) -> tuple[str, int, float] | None:
    """``(kind, center, value)`` when the answer is likely poor, else None: kind ``"merged"``
    (value: the answer's cost ÷ the cheapest split-and-remove answer's), ``"unsettled"``
    (value: the answer's cost ÷ its groups' cost about their pieces' means) or ``"too few"``
    (value: the share of the whole cost splitting ``center`` removes). ``splits[j]``: final
    center j's :func:`center_split` (None: no piece). The answer's cost counts each piece
    about its final center."""
    k = len(final)
    live = [j for j in range(k) if splits[j] is not None]
    if not live:
        return None
    cost = sum(splits[j].cost + splits[j].n * float(((final[j] - splits[j].mean) ** 2).sum())
               for j in live)
    if cost <= 0:
        return None
    own = sum(splits[j].cost for j in live)   # the pieces' cost about their groups' means
    n = np.array([0.0 if s is None else s.n for s in splits])
    M = np.array([np.zeros(final.shape[1]) if s is None else s.mean for s in splits])
    with np.errstate(divide="ignore", invalid="ignore"):
        pair = np.outer(n, n) / (n[:, None] + n[None, :]) * (
            (M[:, None, :] - M[None, :, :]) ** 2).sum(axis=2)
    pair[n[:, None] * n[None, :] <= 0] = np.inf
    np.fill_diagonal(pair, np.inf)
    best, best_j = np.inf, -1
    for j in live:
        s = splits[j]
        if s.gain <= 0 or k < 2:
            continue
        into = pair.copy()
        into[:, j] = np.inf   # j's pieces are now the two halves
        halves = (n[:, None] * s.halves[None, :] / (n[:, None] + s.halves[None, :])
                  * ((M[:, None, :] - s.half_means[None, :, :]) ** 2).sum(axis=2))
        loss = np.minimum(into.min(axis=1), halves.min(axis=1))
        loss[n <= 0] = 0.0   # an empty center goes for free
        loss[j] = np.inf
        alt = own - s.gain + float(loss.min())
        if alt < best:
            best, best_j = alt, j
    if cost > POOR_ANSWER_RATIO * min(best, own):
        if best_j >= 0 and best < own:
            return "merged", best_j, cost / best if best > 0 else np.inf
        moved = [splits[j].n * float(((final[j] - splits[j].mean) ** 2).sum()) for j in live]
        return "unsettled", live[int(np.argmax(moved))], cost / own if own > 0 else np.inf
    gains = np.array([s.gain if s is not None and s.gain > ONE_GROUP_SPLIT_SHARE * s.along
                      else 0.0 for s in splits])
    j = int(np.argmax(gains))
    if gains[j] > (POOR_ANSWER_RATIO - 1.0) * cost:
        return "too few", j, gains[j] / cost
    return None


#: rounding allowance of :func:`surely_quiet`, times the summed squared norms and scatters:
#: its sums (downdated or not) and :func:`center_split`'s differ from exact ones by far less
QUIET_RTOL = 1e-9


def split_bound(C: np.ndarray, w: np.ndarray) -> float:
    """At least the gain of any split of one final center's pieces (centers ``C`` (m, d),
    weights ``w`` (m,)): the largest eigenvalue of their weighted scatter about their mean,
    plus a rounding allowance. A split's gain ``n1 n2 / n |m1 - m2|^2`` is the spread of
    its halves' means along u = m1 - m2, at most the pieces' spread along u."""
    if len(C) < 2:
        return 0.0
    D = C - (C * w[:, None]).sum(axis=0) / float(w.sum())
    M = (D * w[:, None]).T @ D
    return float(np.linalg.eigvalsh(M)[-1]) + QUIET_RTOL * float(np.trace(M))


def surely_quiet(n: np.ndarray, sums: np.ndarray, sq: np.ndarray, scatter: np.ndarray,
                 final: np.ndarray, bound: np.ndarray | None = None) -> bool:
    """Whether :func:`poor_answer` is None whatever split :func:`center_split` finds, from
    each final center's pieces' total weight ``n`` (k,), weighted sum ``sums`` (k, d),
    weighted squared norms ``sq`` (k,) and summed scatter ``scatter`` (k,; each piece's
    clipped at 0 as the split clips it), for the final centers ``final`` (k, d).

    A split of a center's pieces removes at most their spread about its mean,
    ``B_j = sq_j - |sums_j|^2 / n_j`` (a 2-partition's gain is part of it), and every
    split-and-remove answer then costs at least ``own - max_j B_j`` (a merge adds cost).
    So the answer is quiet when it costs at most ``POOR_ANSWER_RATIO`` times that and no
    ``B_j`` reaches ``POOR_ANSWER_RATIO - 1`` of its cost, each with :data:`QUIET_RTOL`'s
    allowance; False where that is not certain (the splits then decide). ``bound`` (k,):
    a tighter bound per center where known (:func:`split_bound`)."""
    live = n > 0
    if not live.any():
        return True
    n, sums, sq, scatter, final = n[live], sums[live], sq[live], scatter[live], final[live]
    spread = np.maximum(sq - np.einsum("kd,kd->k", sums, sums) / n, 0.0)
    gains = spread if bound is None else np.minimum(spread, np.asarray(bound)[live])
    cost = float((scatter + sq - 2.0 * np.einsum("kd,kd->k", final, sums)
                  + n * np.einsum("kd,kd->k", final, final)).sum())
    own = float((scatter + spread).sum())
    err = QUIET_RTOL * float(np.abs(sq).sum() + np.abs(scatter).sum())
    top = float(gains.max()) + err
    if cost <= err:
        return False
    return (cost + err < POOR_ANSWER_RATIO * (own - err - top)
            and top < (POOR_ANSWER_RATIO - 1.0) * (cost - err))


def poor_answer_message(kind: str, center: int, value: float, devs: Sequence[int],
                        n_final: int) -> str:
    """The warning's text for :func:`poor_answer`'s verdict; ``devs`` the devices holding
    pieces of ``center`` (sorted)."""
    listed = ", ".join(map(str, devs[:10])) + (", ..." if len(devs) > 10 else "")
    if kind == "unsettled":
        return (f"k-FED: the one-shot answer is likely poor: its {n_final} centers cost "
                f"{value:.2f}x the same groups' pieces about their own means (final center "
                f"{center}, devices {listed}, lies farthest from its pieces): the server "
                "stopped before its centers settled. Try the default server, or refine with "
                "KFed(refine_rounds=r) or DistributedLloyd(init='kfed')")
    if kind == "merged":
        return (f"k-FED: the one-shot answer is likely poor: its {n_final} centers cost "
                f"{value:.2f}x a {n_final}-center answer built from the same device summaries, "
                f"which splits final center {center} (devices {listed}) and merges two others: "
                "the server merged groups. Try the default server, or refine with "
                "KFed(refine_rounds=r) or DistributedLloyd(init='kfed')")
    return (f"k-FED: final center {center} holds more than one group (devices {listed}): "
            f"splitting it would cut the cost by {value:.0%}. {n_final} clusters may be too "
            "few for the data; try more clusters")


def explanation_warning(centers: Sequence[np.ndarray], counts: Sequence[np.ndarray],
                        scatter: Sequence[np.ndarray], final: np.ndarray,
                        center_labels: Sequence[np.ndarray],
                        device_ids: Sequence[int]) -> str | None:
    """The warning (None when quiet) from the devices' centers (k_z, d), counts (k_z,),
    scatters (k_z,), the final centers (k, d) and each device center's final label (k_z,)."""
    C = np.concatenate(centers, axis=0).astype(np.float64)
    w = np.concatenate([np.asarray(c, dtype=np.float64) for c in counts])
    S = np.concatenate([np.asarray(s, dtype=np.float64) for s in scatter])
    lab = np.concatenate(center_labels).astype(np.int64)
    final = np.asarray(final, dtype=np.float64)
    owner = np.repeat(np.asarray(device_ids, dtype=np.int64), [len(c) for c in centers])
    splits = []
    for j in range(len(final)):
        rows = np.flatnonzero(lab == j)
        splits.append(center_split(C[rows], w[rows], S[rows]) if len(rows) else None)
    verdict = poor_answer(splits, final)
    if verdict is None:
        return None
    kind, j, value = verdict
    return poor_answer_message(kind, j, value, np.unique(owner[lab == j]).tolist(), len(final))
