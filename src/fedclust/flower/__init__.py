"""fedclust on Flower: the same protocols on real clients (optional extra ``flower``).

``pip install 'fedclust[flower]'``. Only this package imports ``flwr``; the rest
of fedclust imports and runs without it. Modules:

* :mod:`~fedclust.flower.codec` — messages and configs <-> Flower records;
* :mod:`~fedclust.flower.apps` — ``make_server_app`` / ``make_client_app``: the
  protocol loop as a ``ServerApp`` (:mod:`~fedclust.flower.server`, run as
  :mod:`~fedclust.flower.spec` says), client steps as a ``ClientApp``;
* :mod:`~fedclust.flower.relay` — graph protocols, the server only relaying
  (:mod:`~fedclust.flower.relay_server`, :mod:`~fedclust.flower.relay_client`);
* :mod:`~fedclust.flower.transport` — ``FlowerSimulationTransport``: Flower's
  simulation engine behind the ``InProcessTransport`` interface;
* :mod:`~fedclust.flower.grid` — ``LocalGrid`` / ``FlowerInMemoryTransport``: the
  real apps in-process, every message through protobuf (tests);
* a deployable Flower app and per-device data files from a config (``fedclust flower
  app`` / ``fedclust flower split``) are written by :mod:`fedclust.flower_app`, which
  builds the protocol as ``fedclust run`` does; this package runs whatever protocol
  it is handed;
* :mod:`~fedclust.flower.pki` — TLS certificates and SuperNode authentication keys
  (``fedclust flower certs`` / ``fedclust flower keys``, with ``cryptography``);
* :mod:`~fedclust.flower.runner` — ``fedclust flower run``: ``flwr run`` whose exit
  status says whether the run completed.

Summed rounds run as secure sums (:mod:`fedclust.core.secure_sum`) when the
ServerSpec / run config asks for ``secure-aggregation``.

Names are imported lazily, so ``import fedclust.flower`` works without flwr and
fails only when a Flower object is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FlowerSimulationTransport", "FlowerInMemoryTransport", "LocalGrid",
           "make_server_app", "make_client_app", "ServerSpec", "register_protocol",
           "forget_on_grid", "make_forget_server_app"]

_WHERE = {
    "FlowerSimulationTransport": "transport",
    "FlowerInMemoryTransport": "grid",
    "LocalGrid": "grid",
    "make_server_app": "apps",
    "make_client_app": "apps",
    "ServerSpec": "apps",
    "forget_on_grid": "forget",
    "make_forget_server_app": "forget",
    "register_protocol": ".core.registry",  # re-exported from fedclust.core.registry
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
