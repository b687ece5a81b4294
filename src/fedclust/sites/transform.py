"""Any family's protocol run on preprocessed site data, the preprocessing done on the sites.

:class:`SiteTransformProtocol` wraps a registered protocol: its rounds, server
maths and messages are the inner protocol's, unchanged; each site, before every
client step, turns its own raw data into the model's inputs — the site schema's
encoding (a CSV/Parquet file read on the node), then the pooled transform of
:class:`fedclust.sites.preprocess.FederatedPreprocessor` (mean imputation, scaling).
The pooled means and scales travel in the protocol's config (what the
preprocessing round broadcast), so no extra round and no row leaves a site.

:class:`SiteTransformTransport` wraps a transport so that an estimator fitted on
server-side preprocessed arrays runs, on that transport, over the raw site data
instead (``fedclust run --transport flower`` with site data): the nodes
preprocess, and the result is the same as in process.

:class:`~fedclust.sites.deployed.SitePreprocessProtocol` is
what a deployed app runs: the schema round and the preprocessing round on the
sites, then the algorithm's rounds; the app holds no site value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog, RunOutput
from ..core.registry import protocol_from_config, register_protocol

__all__ = ["SiteTransformProtocol", "SiteTransformTransport"]


class SiteTransformProtocol(Protocol):
    """``inner`` on data each site encodes and preprocesses itself (see the module docstring).

    Parameters
    ----------
    inner : str
        Registered protocol name; ``inner_config``: its :meth:`Protocol.config` as JSON text.
    mean, scale : list of float
        The pooled transform (``FederatedPreprocessor.mean_`` / ``scale_``).
    impute, scaling : str
        The preprocessing's ``impute`` and ``scale`` settings.
    schema : str
        The site schema (:class:`fedclust.sites.SiteSchema`) as JSON text, or ``""``
        when sites hold arrays.
    """

    name = "site-transform"
    reply_types: Mapping[str, type[Message]] = {}

    def __init__(self, inner: str, inner_config: str, mean: Sequence[float],
                 scale: Sequence[float], impute: str = "mean", scaling: str = "standard",
                 schema: str = ""):
        from .preprocess import FederatedPreprocessor
        from . import SiteSchema

        self.inner_name = str(inner)
        self.inner_config = str(inner_config)
        self.inner = protocol_from_config(self.inner_name, json.loads(self.inner_config))
        self.reply_types = self.inner.reply_types
        self.supervised = self.inner.supervised
        # the inner rounds are unchanged: the same ones are secure sums
        self.summed_actions = frozenset(getattr(self.inner, "summed_actions", ()))
        self.mean = [float(v) for v in mean]
        self.scale = [float(v) for v in scale]
        self.impute, self.scaling, self.schema = str(impute), str(scaling), str(schema)
        self._schema = SiteSchema.from_json(json.loads(self.schema)) if self.schema else None
        cols = self._schema.columns if self._schema else [f"x{j}" for j in range(len(self.mean))]
        pre = FederatedPreprocessor(impute=self.impute, scale=self.scaling)
        m = np.asarray(self.mean)
        pre._set(m, np.asarray(self.scale) ** 2, np.asarray(self.scale),
                 np.zeros(len(m), np.int64), 0, cols)
        self._pre = pre

    @classmethod
    def wrap(cls, protocol: Protocol, preprocessor: Any, schema: Any = None
             ) -> "SiteTransformProtocol":
        return cls(protocol.name, json.dumps(protocol.config()), preprocessor.mean_.tolist(),
                   preprocessor.scale_.tolist(), preprocessor.impute, preprocessor.scale,
                   json.dumps(schema.to_json()) if schema is not None else "")

    def config(self) -> dict[str, Any]:
        return {"inner": self.inner_name, "inner_config": self.inner_config,
                "mean": list(self.mean), "scale": list(self.scale), "impute": self.impute,
                "scaling": self.scaling, "schema": self.schema}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "SiteTransformProtocol":
        return cls(**dict(config))

    @property
    def result_name(self) -> str:
        """The protocol whose result this run returns (for result files)."""
        return self.inner_name

    def secure_form(self) -> "SiteTransformProtocol":
        """The inner protocol's secure form, wrapped the same way."""
        inner = self.inner.secure_form()
        if inner is self.inner:
            return self
        return SiteTransformProtocol(inner.name, json.dumps(inner.config()), self.mean,
                                     self.scale, self.impute, self.scaling, self.schema)

    # -- the site's own data --------------------------------------------------------------
    def encode(self, data: Any) -> Any:
        """Raw site data -> encoded (not yet imputed or scaled) ``X`` or ``(X, y)``."""
        from . import RawTable, encode_table, label_indices, label_values

        if not isinstance(data, RawTable):
            return data
        if self._schema is None:
            raise ValidationError(f"{data.path}: a table needs the federation's site schema")
        X = encode_table(data, self._schema)
        label = self._schema.label
        if label is None:
            return X
        y = label_values(data, label)
        if self._schema.classes is not None:
            y = label_indices(y, self._schema.classes, data.path, label)
        return X, y

    def local_data(self, data: Any, where: str = "site") -> Any:
        """Raw site data -> the inner protocol's input: ``X`` or ``(X, y)``, preprocessed."""
        from . import RawTable, encode_table, label_indices, label_values

        if isinstance(data, RawTable):
            if self._schema is None:
                raise ValidationError(f"{data.path}: a table needs the federation's site schema")
            X = encode_table(data, self._schema)
            y = None
            label = self._schema.label
            if self.supervised:
                if label is None:
                    raise ValidationError(f"{data.path}: the protocol needs labels; no label column")
                y = label_values(data, label)
                if self._schema.classes is not None:
                    y = label_indices(y, self._schema.classes, data.path, label)
            where = data.path
            data = X if y is None else (X, y)
        if isinstance(data, tuple):
            X, y = data
            X = self._pre.transform(X, where=where)
            return (X, y) if self.supervised else X
        if self.supervised:
            raise ValidationError(f"{where}: the protocol needs labels y; the site's data has none")
        return self._pre.transform(data, where=where)

    def node_data(self, data: Any, where: str) -> Any:
        """The node's raw data as it is: :meth:`local_data` encodes and preprocesses it."""
        return data

    # -- everything else is the inner protocol's ------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> Any:
        return self.inner.start(device_ids, seed)

    def next_request(self, state: Any) -> Request | None:
        return self.inner.next_request(state)

    def check_reply(self, state: Any, request: Request, device_id: int, reply: Message) -> None:
        self.inner.check_reply(state, request, device_id, reply)

    def server_step(self, state: Any, request: Request, replies: Mapping[int, Message]) -> None:
        self.inner.server_step(state, request, replies)

    def finish(self, state: Any, log: RunLog) -> Any:
        return self.inner.finish(state, log)

    def final_message(self, result: Any, device_id: int) -> Message | None:
        return self.inner.final_message(result, device_id)

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        return self.inner.client_step(request, self.local_data(X, f"device {device_id}"),
                                      device_id=device_id, seed=seed, state=state)

    def client_finish(self, message: Message | None, X: Any, state: dict[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
        return self.inner.client_finish(message, self.local_data(X), state)

    def __getattr__(self, name: str) -> Any:
        # optional hooks of the inner protocol (assign_late, ...) stay visible to transports
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


@dataclass
class SiteTransformTransport:
    """Runs every protocol as :class:`SiteTransformProtocol` over ``raw`` site data.

    ``raw[z]`` is site z's data before preprocessing (``X`` with NaN, labels
    unchanged); the estimator's own (preprocessed) arrays are replaced by them,
    keeping its labels.
    """

    transport: Any
    raw: Mapping[int, np.ndarray]
    preprocessor: Any
    schema: Any = None

    def run(self, protocol: Protocol, devices: Mapping[int, Any], random_state: Any = None
            ) -> RunOutput:
        wrapped = SiteTransformProtocol.wrap(protocol, self.preprocessor)
        data = {}
        for z, d in devices.items():
            X = self.raw[int(z)]
            data[z] = (X, d[1]) if isinstance(d, tuple) else X
        return self.transport.run(wrapped, data, random_state)

    def __getattr__(self, name: str) -> Any:
        if name == "transport":
            raise AttributeError(name)
        return getattr(self.transport, name)


@dataclass
class _InnerResult:  # placeholder type: results are saved under the inner protocol's type
    pass


register_protocol(SiteTransformProtocol, _InnerResult)
