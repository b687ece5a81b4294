"""Run a protocol's server side again over the kept device summaries.

Why this is exact: a device's reply is a deterministic function of its data,
what it was asked (action + payload), its id and the run's seed
(:mod:`fedclust.core.random` keys every device stream by device id and round,
never by position or row count), and the server reads the replies in device-id
order with its own stream. So a fresh ``fit`` on the federation without the
forgotten data, with the same seed, sends every remaining device the same
requests as long as the server's broadcasts do not change, and gets the same
replies. :func:`replay` walks the protocol's rounds from ``start`` to
``finish`` (whatever its server step is), reuses a kept reply wherever the
device's data is unchanged and the payload it would receive has the same
digest as the one it answered, and asks the device again otherwise — from its
first round, so its own state is the one a fresh run would build. One-shot
protocols (k-FED, the one-round evolving Gaussians) never re-ask a device
whose data did not change; multi-round ones (Lloyd, FedAvg) re-ask everyone
from the first changed broadcast on: that is a retrain, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..core.exceptions import FedClustError, IncompatibleMessageError, ValidationError
from ..core.protocol import Protocol, Request, RunLog
from ..core.threads import one_blas_thread
from .store import RoundRecord, SummaryStore, digest_message

__all__ = ["DevicesNeeded", "ReplayOutput", "replay"]


class DevicesNeeded(ValidationError):
    """Forgetting needs devices to compute again, and their data is not at hand."""


@dataclass
class ReplayOutput:
    """The server's result, the new store, and what had to be computed again:
    ``recomputed`` lists ``(round index, device id)``; ``states`` the device-side
    state of every device that was asked again."""

    result: Any
    store: SummaryStore
    log: RunLog
    recomputed: list[tuple[int, int]] = field(default_factory=list)
    states: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)


def replay(protocol: Protocol, store: SummaryStore, seed: int, *,
           data: Mapping[int, Any] | None = None, fresh: frozenset[int] = frozenset(),
           first_answers: Mapping[int, tuple[str, Any, dict]] | None = None) -> ReplayOutput:
    """The protocol's run over ``store.device_ids`` from the kept replies.

    Parameters
    ----------
    protocol : Protocol
        The protocol object of the fit (its server maths is run as is).
    store : SummaryStore
        The kept summaries, already without the forgotten devices.
    seed : int
        The run's root seed.
    data : mapping device id -> device data, optional
        Devices that can compute again (in-process: the simulated devices).
    fresh : set of device ids
        Devices whose data changed (rows deleted): asked again in every round.
    first_answers : mapping device id -> (payload digest, reply, state), optional
        Replies to the first request already computed (the deletion check), used
        when the payload digest matches.

    Raises
    ------
    DevicesNeeded
        A device must compute again (its payload changed) and ``data`` lacks it.
    """
    with one_blas_thread():   # as the transports run both sides: the same rounding
        return _replay(protocol, store, seed, data or {}, fresh, first_answers or {})


def _replay(protocol, store, seed, data, fresh, first_answers) -> ReplayOutput:
    ids = list(store.device_ids)
    id_set = set(ids)
    log = RunLog()
    state = protocol.start(ids, seed)
    new = SummaryStore(ids, [], store.complete)
    out = ReplayOutput(None, new, log)
    asked: list[tuple[Request, set[int]]] = []    # every request so far and its targets
    digests: dict[int, tuple[Any, str]] = {}
    kept: dict[tuple[int, str], list[RoundRecord]] = {}
    for r in store.rounds:
        kept.setdefault((r.round, r.action), []).append(r)
    i = 0
    while (request := protocol.next_request(state)) is not None:
        # the kept round this request answers: same round number and action (the payload
        # digests below decide whether each device's reply still holds)
        same = kept.get((request.round, request.action))
        rec = same.pop(0) if same else None
        targets = list(ids) if request.devices is None else [
            z for z in request.devices if z in id_set]
        replies: dict[int, Any] = {}
        reply_digests: dict[int, str] = {}
        payloads: dict[int, str] = {}
        need: list[int] = []
        for z in targets:
            msg = request.payload_for(z)
            if id(msg) not in digests or digests[id(msg)][0] is not msg:
                digests[id(msg)] = (msg, digest_message(msg))   # the message kept alive
            payloads[z] = digests[id(msg)][1]
            if z in out.states or z in fresh:
                need.append(z)
            elif rec is not None and rec.payloads.get(z) == payloads[z]:
                if z in rec.replies:
                    replies[z] = rec.replies[z]
                    if z in rec.digests:
                        reply_digests[z] = rec.digests[z]
            else:
                need.append(z)
        if need:
            answered = {z for z in need if i == 0 and z in first_answers
                        and first_answers[z][0] == payloads[z]}
            missing = [z for z in need if z not in data and z not in answered]
            if missing:
                raise DevicesNeeded(
                    f"round {request.round} ({request.action}): the server's request to "
                    f"{len(need)} device(s) changed, so they must compute again, and devices "
                    f"{missing[:10]} are not at hand (pass data= with their arrays, or run a "
                    "fresh fit without the forgotten data)")
            out.recomputed.extend((i, z) for z in need)
            if i == 0 and first_answers:
                for z in [z for z in need if z in first_answers]:
                    digest, msg, st = first_answers[z]
                    if digest == payloads[z]:
                        replies[z] = msg
                        out.states[z] = st
                        need.remove(z)
            replies.update(_ask(protocol, state, request, need, data, seed, out.states, asked))
        asked.append((request, set(targets)))
        replies = {z: replies[z] for z in targets if z in replies}   # the transport's order
        new.rounds.append(RoundRecord(request.round, request.action,
                                      {z: payloads[z] for z in replies}, dict(replies),
                                      reply_digests))
        protocol.server_step(state, request, replies)
        i += 1
    log.participants = sorted({z for r in new.rounds for z in r.replies})
    out.result = protocol.finish(state, log)
    return out


def _ask(protocol: Protocol, server_state: Any, request: Request, need: list[int],
         data: Mapping[int, Any], seed: int, states: dict[int, dict],
         asked: list[tuple[Request, set[int]]]) -> dict[int, Any]:
    """The devices' replies to ``request``; a device asked for the first time in this
    replay first answers its earlier requests again (on a fresh state) so that its own
    state is the one a fresh run would have."""
    reply_type = protocol.reply_types[request.action]
    for z in need:
        if z in states:
            continue
        states[z] = {}
        for prev, targets in asked:
            if z in targets:
                got = protocol.client_steps(prev.for_device(z), {z: data[z]}, seed=seed,
                                            states={z: states[z]})
                if isinstance(got[z], FedClustError):
                    raise got[z]
    groups: dict[int, list[int]] = {}
    for z in need:
        groups.setdefault(id(request.payload_for(z)), []).append(z)
    replies = {}
    for zs in groups.values():
        got = protocol.client_steps(request.for_device(zs[0]), {z: data[z] for z in zs},
                                    seed=seed, states={z: states[z] for z in zs})
        for z in zs:
            reply = got[z]
            if isinstance(reply, FedClustError):
                raise reply
            msg = reply_type.from_arrays(reply.to_arrays(), sender=f"device {z}")
            try:
                protocol.check_reply(server_state, request, z, msg)
            except IncompatibleMessageError as exc:
                raise ValidationError(f"forget: {exc}") from None
            replies[z] = msg
    return replies
