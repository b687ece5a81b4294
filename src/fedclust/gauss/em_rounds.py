"""The federated EM rounds of :class:`~fedclust.gauss.protocol.GaussProtocol` (``em_rounds > 0``).

The server sends the current mixture and the candidate merges, drops and splits
(:func:`em_payload`); every owner returns the row-level log-likelihood (and
responsibility entropy) of each and the E-step statistics (:func:`em_statistics`);
the server sums them, keeps the model with the lowest BIC (or ICL) and takes one
M-step (:func:`em_step`). The maths lives in :mod:`fedclust.gauss.federated_em`;
this module is its message side.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import Message
from .federated_em import (EM_TOL, Mixture, candidate_edits, choose_and_step, device_statistics,
                           integer_counts)
from .local import from_message
from .messages import GaussEMStats, GaussMixture
from .model import ClusterSet, Settings, one_thread
from .stats import pack_scatter, unpack_scatter

__all__ = ["em_payload", "check_em_reply", "em_step", "em_statistics"]


def em_payload(state: Any, settings: Settings) -> GaussMixture:
    """The mixture and candidate edits of the next EM round (the first round starts from
    the merged model in ``state.model``); sets ``state.mix``, ``state.ridge``, ``state.edits``."""
    if state.mix is None:
        cs = from_message(state.model, settings, 0)
        C = cs.C
        ridge = cs.s0_rule
        S, n = cs.S[:C], cs.n[:C]
        covs = ((S + np.diag(ridge)) / n[:, None, None] if cs.full
                else (S + ridge) / n[:, None])
        state.mix, state.ridge = Mixture(n / n.sum(), cs.mu[:C].copy(), covs), ridge
    state.edits = candidate_edits(state.mix)
    mix = state.mix
    return GaussMixture(weights=mix.weights, means=mix.means,
                        covs=pack_scatter(mix.covs) if mix.full else mix.covs.copy(),
                        edits=state.edits.copy())


def check_em_reply(state: Any, device_id: int, reply: Message) -> None:
    """Reject an EM reply of the wrong type or shape, naming the device."""
    if not isinstance(reply, GaussEMStats):
        raise IncompatibleMessageError(
            f"device {device_id}: expected gauss_em, got {type(reply).__name__}")
    mix, c = state.mix, len(state.edits)
    K, D = mix.means.shape
    w = D * (D + 1) // 2 if mix.full else D
    if reply.first.shape != (K, D) or reply.second.shape != (K, w) \
            or reply.loglik.shape != (c + 1,) or reply.entropy.shape != (c + 1,):
        raise IncompatibleMessageError(
            f"device {device_id}: EM statistics have shapes {reply.first.shape}, "
            f"{reply.second.shape}, {reply.loglik.shape}; the mixture needs ({K}, {D}), "
            f"({K}, {w}), ({c + 1},)")


def em_step(state: Any, replies: Mapping[int, Message], settings: Settings,
            criterion: str) -> ClusterSet | None:
    """Sum the owners' EM statistics, keep the lowest-criterion model, one M-step.

    Returns the new global model as a cluster set (None when no owner replied: EM
    ends); updates ``state.mix``, ``state.em_round``, ``state.em_done``,
    ``state.em_ll`` and appends this round to ``state.em_trace``."""
    mix = state.mix
    assert mix is not None and state.edits is not None and state.ridge is not None
    msgs = [replies[z] for z in sorted(replies)]
    state.em_round += 1
    if not msgs:
        state.em_done = True
        return None
    D = mix.means.shape[1]
    ll = sum(m.loglik for m in msgs)
    ent = sum(m.entropy for m in msgs) if criterion == "icl" else None
    N = sum(m.resp for m in msgs)
    first = sum(m.first for m in msgs)
    second = sum((unpack_scatter(m.second, D) if mix.full else m.second) for m in msgs)
    if (N <= 0).any():  # a component no row supports: only drop it this round
        keep = N > 0
        mix = Mixture(mix.weights[keep] / mix.weights[keep].sum(), mix.means[keep],
                      mix.covs[keep])
        new, S = choose_and_step(mix, np.zeros((0, 2), np.int64), ll[:1], N[keep],
                                 first[keep], second[keep], state.ridge)[:2]
        kept, bic = 0, np.zeros(0)
    else:
        new, S, kept, bic = choose_and_step(mix, state.edits, ll, N, first, second,
                                            state.ridge, ent)
    rows = float(N.sum())
    state.em_trace.append({"round": state.em_round, "components": mix.K,
                           "kept": "none" if not kept else
                           [int(v) for v in state.edits[kept - 1]],
                           "loglik": float(ll[0]), "criterion": criterion,
                           "scores": [float(b) for b in bic]})
    if kept == 0 and float(ll[0]) - state.em_ll < EM_TOL * rows:
        state.em_done = True
    state.em_ll = float(ll[0]) if kept == 0 else -np.inf
    state.mix = new
    m = state.model
    assert m is not None
    counts = integer_counts(new.weights, int(m.global_count))
    live = counts >= 1  # a component rounding to no row goes (its share is < half a row)
    with one_thread():
        cs = ClusterSet(D, settings, 0)
        cs.set_global(float(m.global_count), m.global_mean, m.global_m2)
        cs.add(new.means[live], S[live], counts[live].astype(float),
               np.full(int(live.sum()), -1, np.int64), np.zeros(int(live.sum()), np.int64))
    return cs


def em_statistics(msg: Any, Xd: np.ndarray, device_id: int, settings: Settings) -> GaussEMStats:
    """One owner's reply to an EM round: statistics of all its rows ``Xd`` (n, D)."""
    if not isinstance(msg, GaussMixture):
        raise ValidationError(f"device {device_id}: an EM round needs a GaussMixture, got "
                              f"{type(msg).__name__}")
    K, D = msg.means.shape
    if Xd.shape[1] != D:
        raise ValidationError(f"device {device_id} has {Xd.shape[1]} features but the "
                              f"mixture has {D}")
    full = settings.covariance == "full"
    covs = unpack_scatter(msg.covs, D) if full else msg.covs
    mix = Mixture(msg.weights, msg.means, covs)
    with one_thread():
        ll, N, first, second, ent = device_statistics(Xd, mix, msg.edits)
    return GaussEMStats(loglik=ll, entropy=ent, resp=N, first=first,
                        second=pack_scatter(second) if full else second)
