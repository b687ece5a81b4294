"""Forgetting a site on Flower: the sites' own forget requests, the server's recompute.

A site that withdraws says so in its SuperNode's node config: ``forget="device"``
(the site leaves; its summaries must go) or ``forget="rows"`` (some rows
were deleted from its data file; the file now holds the remaining rows). The
server of a fitted model (:func:`forget_on_grid`, or the ``ServerApp`` of
:func:`make_forget_server_app`) sends every connected node, or the devices it
names, one ``query.fedclust_forget`` message: the device id the server believes
it addresses, and the fit's first request (its action and payload). Each node

* refuses, by its device id, a request naming another device (a device asks
  only for itself), a request without a device or with an action its protocol
  does not have, and whatever its :class:`~fedclust.core.policy.DevicePolicy`
  does not allow (:meth:`~fedclust.core.policy.DevicePolicy.check_forget`: the
  protocol, the ``"fedclust_forget"`` action where ``actions`` is set, no second
  release under ``privacy=``);
* answers ``level="none"`` when it does not withdraw;
* answers ``level="device"`` when it leaves (nothing else is sent);
* answers ``level="rows"`` with its local step run again on its remaining rows:
  its new summary, under the run's seed and its device id, as in the fit.

The server validates every answer (the device id it asked, a known level, the
summary's codec and the protocol's ``check_reply``), names and skips the bad
ones, and applies the rest with :meth:`~fedclust.unlearning.ForgetMixin.forget`
over the summaries it kept: the model equals a fresh fit without the departed
site and rows (same seed, same device ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.policy import FORGET_ACTION, DevicePolicy, PolicyRefusal
from ..core.protocol import Protocol, Request
from ..core.threads import one_blas_thread
from .codec import FORGET, REPLY, arrays_to_record, record_to_arrays, request_to_content

__all__ = ["FlowerForgetReport", "forget_on_grid", "forget_reply", "make_forget_server_app",
           "forget_saved_model_on_grid", "forget_from_run_config", "LEVELS"]

#: what a node's ``forget`` node config may say; ``"none"``: it does not withdraw
LEVELS = ("device", "rows")
_ASKED = "forget-device"    # request head: the device the server addresses
_ACTION = "forget-action"   # request head: the fit's first action (rows: run it again)


# --------------------------------------------------------------------------- device side
def forget_reply(protocol: Protocol, request: Request, seed: int, head: dict[str, Any],
                 device_id: int, X: Any, context: Context, policy: DevicePolicy) -> RecordDict:
    """The node's answer to ``query.fedclust_forget`` (see the module docstring)."""
    me = f"device {device_id}"
    asked = head.get(_ASKED)
    if isinstance(asked, bool) or not isinstance(asked, int):
        raise IncompatibleMessageError(f"{me}: the forget request names no device "
                                       f"({_ASKED}={asked!r})")
    if asked != int(device_id):
        raise PolicyRefusal(f"{me}: refuses to forget device {asked}: a device asks to "
                            "forget only its own data")
    level = context.node_config.get("forget")
    if level is None:
        return RecordDict({FORGET: ConfigRecord({"device-id": int(device_id), "level": "none"})})
    if level not in LEVELS:
        raise ValidationError(f"{me}: node config forget={level!r} must be one of {LEVELS}")
    policy.check_forget(protocol, str(level), me)
    content = RecordDict({FORGET: ConfigRecord({"device-id": int(device_id),
                                                "level": str(level)})})
    if level == "rows":
        action = head.get(_ACTION)
        if action not in protocol.reply_types:
            raise IncompatibleMessageError(
                f"{me}: the forget request's first action {action!r} is not one of protocol "
                f"{protocol.name!r}'s ({sorted(protocol.reply_types)})")
        step = Request(request.round, str(action), request.payload)
        X = protocol.node_data(X, me)
        with one_blas_thread():   # the fit's rounding
            reply = protocol.client_step(step, X, device_id=int(device_id), seed=seed, state={})
        content[REPLY] = arrays_to_record(reply.to_arrays())
    return content


# --------------------------------------------------------------------------- server side
@dataclass
class FlowerForgetReport:
    """What one forget run did: the sites that left, the sites whose rows were
    deleted (their new summaries applied), the refusals and rejected answers by
    device, and the model's :class:`~fedclust.unlearning.ForgetRecord` (None: nothing
    to forget)."""

    devices: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    record: Any = None


def forget_on_grid(model: Any, grid: Grid, devices: Iterable[Any] | None = None, *,
                   min_nodes: int = 1, node_wait_s: float = 30.0,
                   round_timeout_s: float | None = None) -> FlowerForgetReport:
    """Ask the nodes of ``grid`` for their forget requests and apply them to ``model``.

    Parameters
    ----------
    model : fitted estimator with ``forget``
        Its kept summaries are the server's memory of the fit (any transport).
    grid : flwr.serverapp.Grid
        The SuperNodes of the federation (those online).
    devices : iterable of int or str, optional
        Devices (ids or site names) to ask; ``None``: every connected node.
    min_nodes, node_wait_s, round_timeout_s
        As for a run (:class:`~fedclust.flower.apps.ServerSpec`).

    Returns
    -------
    FlowerForgetReport
    """
    from .server import Server
    from .spec import ServerSpec
    from .codec import reply_failure as _reason

    u = model._unlearner()
    spec = ServerSpec.for_protocol(u.protocol, u.seed, min_nodes=int(min_nodes),
                                   node_wait_s=float(node_wait_s),
                                   round_timeout_s=round_timeout_s)
    server = Server(grid, spec)
    server.hello()
    report = FlowerForgetReport()
    known = set(u.store.device_ids)
    if devices is None:
        targets = sorted(z for z in server.node_of if z in known)
    else:
        targets = sorted({model._resolve(u, z) for z in devices})
        for z in [z for z in targets if z not in server.node_of]:
            report.refused[z] = f"device {z}: no connected node answers for it"
        targets = [z for z in targets if z in server.node_of]
    protocol = u.protocol
    state = protocol.start(u.store.device_ids, u.seed)
    first = protocol.next_request(state)
    if first is None or not targets:
        return report
    msgs = []
    for z in targets:
        content = request_to_content(
            protocol, Request(first.round, FORGET_ACTION), u.seed, first.payload_for(z),
            **{_ASKED: int(z), _ACTION: first.action})
        msgs.append(Message(content, dst_node_id=server.node_of[z],
                            message_type=f"query.{FORGET_ACTION}", group_id="forget"))
    got = server._exchange(msgs, targets)
    summaries = {}
    for z in targets:
        try:
            level, msg = _read_answer(z, got[z], _reason, protocol, state, first)
        except (ValidationError, IncompatibleMessageError) as exc:
            report.refused[z] = str(exc)
            continue
        if level == "device":
            report.devices.append(z)
        elif level == "rows":
            report.rows.append(z)
            summaries[z] = msg
    if report.devices or summaries:
        model.forget(devices=report.devices, summaries=summaries)
        report.record = model.forget_log_[-1]
    return report


def _read_answer(z: int, reply: Message | None, reason: Callable, protocol: Protocol,
                 state: Any, first: Request) -> tuple[str, Any]:
    if reply is None:
        raise ValidationError(f"device {z}: no answer to the forget request (timed out)")
    why = reason(reply)
    if why is not None:
        raise ValidationError(f"device {z}: {why}")
    if FORGET not in reply.content.config_records:
        raise IncompatibleMessageError(f"device {z}: the answer has no {FORGET} record")
    rec = reply.content.config_records[FORGET]
    if rec.get("device-id") != z:
        raise IncompatibleMessageError(f"device {z}: the answer is for device "
                                       f"{rec.get('device-id')!r}")
    level = rec.get("level")
    if level not in (*LEVELS, "none"):
        raise IncompatibleMessageError(f"device {z}: unknown forget level {level!r}")
    if level != "rows":
        return str(level), None
    if REPLY not in reply.content.array_records:
        raise IncompatibleMessageError(f"device {z}: a row-level forget without its new summary")
    arrays = record_to_arrays(reply.content.array_records[REPLY], sender=f"device {z}")
    msg = protocol.reply_types[first.action].from_arrays(arrays, sender=f"device {z}")
    protocol.check_reply(state, first, z, msg)
    return "rows", msg


def make_forget_server_app(model: Any, devices: Iterable[Any] | None = None, *,
                           on_result: Callable[[FlowerForgetReport], None] | None = None,
                           **kw: Any) -> ServerApp:
    """A ``ServerApp`` whose run is :func:`forget_on_grid` on ``model`` (``kw``: its options)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        report = forget_on_grid(model, grid, devices, **kw)
        if on_result is not None:
            on_result(report)

    return app


def forget_saved_model_on_grid(path: str | Path, grid: Grid, out: str | Path | None = None,
                               **kw: Any) -> tuple[Path | None, FlowerForgetReport]:
    """:func:`forget_on_grid` for a saved ``model.npz`` (``fedclust run``'s model with its
    kept summaries); writes the new model to ``out`` (default: in place) when something
    was forgotten. Returns ``(the file written or None, the report)``."""
    from ..unlearning.saved import load_forgettable

    saved = load_forgettable(path)
    report = forget_on_grid(saved.model, grid, **kw)
    return (saved.write(out) if report.record is not None else None), report


def forget_from_run_config(grid: Grid, run_config: Any, root: str | Path) -> FlowerForgetReport:
    """The ServerApp's forget run (run config ``forget-model``): the model file and
    ``forget-out`` (default: the model file) must lie inside the app's output folder
    ``root``; writes ``forget.json`` (the report) beside the new model."""
    import json

    from .spec import confine_result_dir

    model = Path(confine_result_dir(str(run_config["forget-model"]), root))
    out = Path(confine_result_dir(str(run_config.get("forget-out") or model), root))
    out.parent.mkdir(parents=True, exist_ok=True)
    target, report = forget_saved_model_on_grid(
        model, grid, out, min_nodes=int(run_config.get("min-nodes", 1)),
        node_wait_s=float(run_config.get("node-wait-s", 30.0)))
    doc = {"model": None if target is None else str(target), "devices": report.devices,
           "rows": report.rows, "refused": {str(z): r for z, r in report.refused.items()},
           "record": None if report.record is None else report.record.to_json()}
    (out.parent / "forget.json").write_text(json.dumps(doc, indent=1))
    return report
