"""Which protocols a Flower client can rebuild from a config (no flwr import).

A :class:`~fedclust.protocols.base.Protocol` travels as its ``name`` plus the
scalars of :meth:`~fedclust.protocols.base.Protocol.config`; a client looks the
name up here and calls ``from_config``. The server's result object travels back
to the transport through :mod:`fedclust.flower.results`, which needs the result
class of each protocol. A new protocol family registers once with
:func:`register_protocol` and then runs on every Flower path unchanged.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..exceptions import ValidationError
from ..protocols.base import Protocol
from ..protocols.kfed import KFedProtocol, KFedResult
from ..protocols.lloyd import DistributedLloydProtocol, DistributedLloydResult

__all__ = ["PROTOCOLS", "RESULT_TYPES", "register_protocol", "build_protocol", "all_actions"]

#: protocol name -> protocol class
PROTOCOLS: dict[str, type[Protocol]] = {}
#: protocol name -> result dataclass (what ``Protocol.finish`` returns)
RESULT_TYPES: dict[str, type] = {}


def register_protocol(protocol_cls: type[Protocol], result_cls: type) -> None:
    """Make ``protocol_cls`` runnable on Flower (its actions must be identifiers)."""
    for action in protocol_cls.reply_types:
        if not action.isidentifier():
            raise ValidationError(
                f"protocol {protocol_cls.name!r}: action {action!r} must be a Python identifier "
                "(Flower message types are 'query.<action>')")
    PROTOCOLS[protocol_cls.name] = protocol_cls
    RESULT_TYPES[protocol_cls.name] = result_cls


register_protocol(KFedProtocol, KFedResult)
register_protocol(DistributedLloydProtocol, DistributedLloydResult)


def build_protocol(name: str, config: Mapping[str, Any]) -> Protocol:
    """Rebuild a protocol from its name and :meth:`Protocol.config`."""
    try:
        cls = PROTOCOLS[name]
    except KeyError:
        raise ValidationError(
            f"unknown protocol {name!r}; registered: {sorted(PROTOCOLS)}") from None
    return cls.from_config(dict(config))


def all_actions() -> list[str]:
    """Every client action of every registered protocol (sorted)."""
    return sorted({a for cls in PROTOCOLS.values() for a in cls.reply_types})
