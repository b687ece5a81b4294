"""A securely summed round on the in-process transport (see :mod:`fedclust.core.secure_sum`).

The four stages run over the simulated devices: each device's secrets stay in
its own state dict, the server object sees only what would cross the network
(public keys, encrypted shares, masked vectors, revealed shares), and the
protocol's ``server_step`` gets one reply, the decoded sum, under
:data:`~fedclust.core.secure_sum.SUMMED`. Bytes of every stage are counted.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..core.exceptions import FedClustError, IncompatibleMessageError
from ..core.messages import Message, message_nbytes
from ..core.protocol import Protocol, Request, RunLog
from ..core.secure_sum_device import secure_sum_client
from ..core.secure_sum import (SUMMED, DeviceIdentity, SecureAggregation, SecureSumServer)

__all__ = ["secure_round", "summed_replies"]


def _nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(np.asarray(a).nbytes for a in arrays.values())


def secure_round(protocol: Protocol, state: Any, request: Request, targets: Sequence[int],
                 devices: Mapping[int, Any], states: Mapping[int, dict[str, np.ndarray]],
                 seed: int, settings: SecureAggregation, meter, log: RunLog, *,
                 tamper: Callable | None = None, drop_after_masking: Sequence[int] = (),
                 raise_client_errors: bool = True,
                 identities: Mapping[int, DeviceIdentity] | None = None,
                 server: Callable[..., SecureSumServer] = SecureSumServer,
                 admit: Callable[[list[int]], list[int]] | None = None,
                 policies: Mapping[int, Any] | None = None,
                 round_id: int | None = None) -> dict[int, Message]:
    """Run ``request`` over ``targets`` as a secure sum; returns ``{SUMMED: sum message}``.

    ``identities`` (``settings.signed``): each device's identity key and directory.
    ``server`` builds the server side (tests put a lying server there).
    ``admit(devices) -> devices`` applies the devices' policies before they compute
    their replies; ``policies`` (device id -> policy) gives each its group rule.
    ``round_id``: the secure round's id (default ``request.round``; a resumed run
    gives a redone round a new one).
    """
    srv = server(targets, request.round if round_id is None else int(round_id), settings, seed)
    drop = {int(z) for z in drop_after_masking}
    identities = identities or {}
    for stage in srv.stages:
        inbound = srv.requests(stage)
        computed: dict[int, Any] = {}
        if stage == "mask":
            allowed = admit(list(inbound)) if admit is not None else list(inbound)
            computed = _client_replies(protocol, request, allowed, devices, states, seed)
            for z in inbound:
                if z not in computed:
                    computed[z] = FedClustError(log.failed.get(z, f"device {z}: refused by its "
                                                                   "policy"))
        replies: dict[int, dict[str, np.ndarray]] = {}
        reasons: dict[int, str] = {}
        for z, msg in inbound.items():
            down = _nbytes(msg)
            if stage == "mask":
                down += message_nbytes(request.payload_for(z))
            meter.record_down(z, down)
            try:
                plain = None
                if stage == "mask":
                    reply = computed[z]
                    if isinstance(reply, FedClustError):
                        raise reply
                    plain = reply.to_arrays()
                    if tamper is not None:
                        plain = tamper(z, request.round, plain)
                out = secure_sum_client(stage, msg, states[z], device_id=z, reply=plain,
                                        identity=identities.get(z),
                                        policy=(policies or {}).get(z),
                                        action=request.action)
            except FedClustError as exc:
                if raise_client_errors:
                    raise
                reasons[z] = str(exc) if str(exc).startswith("device") else f"device {z}: {exc}"
                continue
            if stage == "mask" and z in drop:
                reasons[z] = f"device {z}: dropped after masking (simulated)"
                continue
            meter.record_up(z, _nbytes(out))
            replies[z] = out
        srv.take(stage, replies, reasons)
    return summed_replies(protocol, state, request, srv, meter, log)


def summed_replies(protocol: Protocol, state: Any, request: Request, srv: SecureSumServer,
                   meter, log: RunLog) -> dict[int, Message]:
    """After the last stage (any transport): log who was left out, decode and check the sum."""
    meter.secure_exchanges = getattr(meter, "secure_exchanges", 0) + len(srv.stages) - 1
    log.failed.update(srv.failed)
    log.rejected.update(srv.rejected)
    sender = f"the secure sum of round {request.round}"
    total = protocol.reply_types[request.action].from_arrays(srv.result(), sender=sender)
    try:
        protocol.check_reply(state, request, SUMMED, total)
    except IncompatibleMessageError as exc:
        raise IncompatibleMessageError(f"{sender}: {exc}") from None
    return {SUMMED: total}


def _client_replies(protocol, request, targets, devices, states, seed):
    if request.payloads is None:
        return protocol.client_steps(request, {z: devices[z] for z in targets}, seed=seed,
                                     states={z: states[z] for z in targets})
    out = {}
    for z in targets:
        out.update(protocol.client_steps(request.for_device(z), {z: devices[z]}, seed=seed,
                                         states={z: states[z]}))
    return out
