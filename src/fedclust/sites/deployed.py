"""The protocol of a deployed run on site files: the schema round and the preprocessing
round on the sites, then the algorithm's own rounds (:class:`SitePreprocessProtocol`).

:func:`fedclust.sites.deployed_app.deployed_protocol` builds it from a config alone
(``fedclust flower app``).
No flwr import, no family name: the algorithm is reached through the registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import FLOAT, INT, Message
from ..core.protocol import Protocol, Request, RunLog, RunOutput
from ..core.registry import protocol_from_config, register_protocol

__all__ = ["SitePreprocessProtocol", "TransformReceived", "LateSiteModel"]


@dataclass(frozen=True)
class TransformReceived(Message):
    """Site -> server: the broadcast (schema or pooled transform) is stored (its row count, ``8`` bytes)."""

    n_rows: np.ndarray  # () int64
    schema: ClassVar = {"n_rows": (INT, 0)}
    kind: ClassVar[str] = "transform_received"


@dataclass(frozen=True)
class LateSiteModel(Message):
    """Server -> late site, with the late request: the schema broadcast and the pooled transform
    (the site missed those rounds). Bytes: the schema text + ``16 d``."""

    text: np.ndarray   # (b,) uint8
    mean: np.ndarray   # (d,)
    scale: np.ndarray  # (d,)
    schema: ClassVar = {"text": (INT, 1), "mean": (FLOAT, 1), "scale": (FLOAT, 1)}
    kind: ClassVar[str] = "late_site_model"


_SCHEMA_UP = "site_schema"
_SCHEMA_DOWN = "schema_union"
_STORE = "pooled_transform"
_TEXT, _MEAN, _SCALE = "_site_schema", "_site_pre_mean", "_site_pre_scale"
_LATE, _CLIPPED = "_site_late", "_site_pre_clipped"
_MINE = (_TEXT, _MEAN, _SCALE, _LATE, _CLIPPED)


@dataclass
class _CompositeState:
    device_ids: tuple[int, ...]
    seed: int
    phase: int = 0        # 0 schema up, 1 schema down, 2 column moments, 3 transform, 4 inner
    schema: Any = None    # SiteSchema
    names: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    broadcast: Any = None  # SchemaBroadcast
    moments_protocol: Any = None
    moments: Any = None
    inner_protocol: Any = None
    inner: Any = None
    pooled: Any = None     # PreprocessResult


class SitePreprocessProtocol(Protocol):
    """The schema round and the preprocessing round on the sites, then the algorithm's protocol.

    What a deployed run on site files runs (``fedclust flower app``); the
    configuration holds what ``[data]`` declares and the algorithm's settings,
    no column of a site file and no statistic. Rounds:

    1. ``site_schema``: each site sends its column names, the category set of
       every declared categorical column and, for a classifier, its set of label
       values (:class:`~fedclust.sites.schema_round.SiteColumns`: JSON + 8 bytes,
       no row). The server checks every site has the federation's columns (a
       missing one stops the run with one line naming the site and the column),
       takes the sorted union of categories and labels, and builds the
       algorithm's protocol for that schema (the registered estimator's own
       validation, on the schema's shape).
    2. ``schema_union``: the schema and that protocol's config are broadcast
       (:class:`~fedclust.sites.schema_round.SchemaBroadcast`); each site keeps
       them in its state and answers 8 bytes.
    3. ``column_moments``: :class:`fedclust.sites.preprocess.PreprocessProtocol`'s round
       on the encoded rows (``24 d + 8`` bytes up), pooled exactly; under secure
       aggregation its summed form, ``column_sums`` then ``column_squares``
       (``16 d + 8`` and ``8 d + 8`` bytes up), each a secure sum. With privacy
       (``experiment["privacy"]``) the sites clip to the public column ranges
       and the server releases the noisy statistics ``FederatedPreprocessor``
       releases in process (:func:`fedclust.sites.algorithm.preprocess_protocol`).
    4. ``pooled_transform``: mean and scale down (``16 d``), kept by each site.
    5. the algorithm's rounds, unchanged, each site encoding, imputing and scaling
       its rows with what it stored.

    Faults: a device dropped by ``[simulation]`` is absent from every round, the
    preprocessing rounds included (the pooled statistics are those of the sites
    that take part) and has no output; a late device gets the schema and the
    pooled transform with its late request (:class:`LateSiteModel`) and is
    assigned as the algorithm assigns late devices.

    Parameters
    ----------
    inner : str
        Registered name of the algorithm's protocol.
    experiment : str
        JSON: ``{"algorithm": {...}, "seed": s, "secure_aggregation": b}`` and,
        with ``[privacy]``, ``"privacy"`` (its table) and ``"preprocess_privacy"``
        (``budget_share``, ``bounds``, ``site_rows``): what builds the
        preprocessing's and the algorithm's protocols once the schema is known;
        the algorithm's budget is what the preprocessing's release leaves.
    request : str
        JSON of :class:`~fedclust.sites.schema_round.SchemaRequest` (``[data]``'s
        features, categorical, label, id_columns and what labels the algorithm takes).
    impute, scaling : str
        The preprocessing's ``impute`` and ``scale`` settings.
    supervised : bool
        Whether the algorithm's protocol takes labels.
    summed : list of str
        Actions whose replies the server only sums (secure aggregation).
    site_ids : {"position", "name"}
        How the sites are numbered (``[data] site_ids``): by each node's ``device-id``,
        or each by its name, the stem of its file
        (:func:`fedclust.core.random.named_device_id`, derived on the node whatever
        its ``device-id``): a site's random streams and the protocol's slots then
        follow it whichever other sites take part.
    """

    name = "site-preprocess"
    reply_types: Mapping[str, type[Message]] = {}  # set below, once the messages exist

    def __init__(self, inner: str, experiment: str, request: str, impute: str = "mean",
                 scaling: str = "standard", supervised: bool = False,
                 summed: Sequence[str] = (), site_ids: str = "position"):
        from ..core.registry import PROTOCOLS
        from ..core.validation import check_choice
        from .preprocess import IMPUTE, SCALE
        from .schema_round import SchemaRequest

        self.inner_name = str(inner)
        if self.inner_name not in PROTOCOLS:
            raise ValidationError(f"unknown protocol {self.inner_name!r}; registered: "
                                  f"{sorted(PROTOCOLS)}")
        self.experiment, self.request = str(experiment), str(request)
        self._request = SchemaRequest.from_json(json.loads(self.request))
        self.impute = check_choice(str(impute), "impute", IMPUTE)
        self.scaling = check_choice(str(scaling), "scale", SCALE)
        self.supervised = bool(supervised)
        self.summed = [str(a) for a in summed]
        self.summed_actions = frozenset(self.summed)
        self.site_ids = check_choice(str(site_ids), "site_ids", ("position", "name"))
        # the algorithm's actions first: a transport asks a late device the first one
        self.reply_types = {**PROTOCOLS[self.inner_name].reply_types, **type(self).reply_types}
        self.inner: Protocol | None = None  # the server's, built in the schema round
        self._late: LateSiteModel | None = None
        self._cache: dict[bytes, tuple[Any, Protocol, Any]] = {}

    def config(self) -> dict[str, Any]:
        return {"inner": self.inner_name, "experiment": self.experiment, "request": self.request,
                "impute": self.impute, "scaling": self.scaling, "supervised": self.supervised,
                "summed": list(self.summed), "site_ids": self.site_ids}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "SitePreprocessProtocol":
        return cls(**dict(config))

    @property
    def result_name(self) -> str:
        """The protocol whose result this run returns (for result files)."""
        return self.inner_name

    # -- server ---------------------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _CompositeState:
        return _CompositeState(tuple(int(z) for z in device_ids), int(seed))

    def node_device_id(self, data: Any, given: int | None) -> int | None:
        """Under ``site_ids = "name"``: the id of the site's name (its file's stem), the
        id ``fedclust run`` gives it; otherwise the node's configured id."""
        if self.site_ids != "name":
            return given
        from ..core.random import named_device_id
        from .schema_round import as_table

        return named_device_id(as_table(data, "site").name)

    def next_request(self, state: _CompositeState) -> Request | None:
        from .preprocess import PooledTransform

        if state.phase == 0:
            return Request(round=0, action=_SCHEMA_UP)
        if state.phase == 1:
            return Request(round=0, action=_SCHEMA_DOWN, payload=state.broadcast)
        if state.phase == 2:
            return state.moments_protocol.next_request(state.moments)
        if state.phase == 3:
            return Request(round=0, action=_STORE, payload=PooledTransform(
                mean=state.pooled.mean, scale=state.pooled.scale))
        return state.inner_protocol.next_request(state.inner)

    def check_reply(self, state: _CompositeState, request: Request, device_id: int,
                    reply: Message) -> None:
        if state.phase == 2:
            state.moments_protocol.check_reply(state.moments, request, device_id, reply)
        elif state.phase == 4:
            state.inner_protocol.check_reply(state.inner, request, device_id, reply)

    def _build_inner(self, schema: Any, sizes: Mapping[int, int]) -> Protocol:
        from .algorithm import protocol_for_schema

        exp = json.loads(self.experiment)
        if self.site_ids == "name":   # the protocol's slots are the sites' own ids
            ids = sorted(sizes)
            inner = protocol_for_schema(exp, len(schema.columns), [sizes[z] for z in ids],
                                        schema.classes, self._request.labels, device_ids=ids)
        else:
            n_dev = max([*sizes, *[-1]]) + 1
            fill = max(sizes.values(), default=1)  # a site that did not answer: shape only
            inner = protocol_for_schema(exp, len(schema.columns),
                                        [sizes.get(z, fill) for z in range(n_dev)],
                                        schema.classes, self._request.labels)
        if inner.name != self.inner_name:
            raise ValidationError(f"the algorithm built protocol {inner.name!r} for the sites' "
                                  f"schema, the app was written for {self.inner_name!r}")
        return inner

    def server_step(self, state: _CompositeState, request: Request,
                    replies: Mapping[int, Message]) -> None:
        from .algorithm import preprocess_protocol
        from .schema_round import SchemaBroadcast, pool_schema, text_array

        if state.phase == 0:
            schema, names = pool_schema(replies, self._request)
            state.schema, state.names = schema, names
            from .schema_round import PRIVATE_SITE_ROWS

            state.sizes = {z: PRIVATE_SITE_ROWS if self._request.private else int(r.n_rows)
                           for z, r in replies.items()}
            inner = self._build_inner(schema, state.sizes)
            state.inner_protocol = self.inner = inner
            # the built protocol's own reply types (a private one's noisy replies, ...)
            self.reply_types = {**inner.reply_types, **type(self).reply_types}
            state.broadcast = SchemaBroadcast(text=text_array(
                {"schema": schema.to_json(), "inner": inner.config()}))
            state.moments_protocol = preprocess_protocol(
                json.loads(self.experiment), self.impute, self.scaling, schema.columns,
                names=() if self.site_ids == "name" else
                [names.get(z, f"device {z}") for z in range(max(names) + 1)])
            state.moments = state.moments_protocol.start(state.device_ids, state.seed)
            state.inner = inner.start(state.device_ids, state.seed)
            state.phase = 1
        elif state.phase == 1:
            state.phase = 2
        elif state.phase == 2:
            state.moments_protocol.server_step(state.moments, request, replies)
            if state.moments_protocol.next_request(state.moments) is None:
                state.pooled = state.moments_protocol.finish(state.moments, RunLog())
                state.phase = 3
        elif state.phase == 3:
            state.phase = 4
        else:
            state.inner_protocol.server_step(state.inner, request, replies)

    def finish(self, state: _CompositeState, log: RunLog) -> Any:
        result = state.inner_protocol.finish(state.inner, log)
        self._late = LateSiteModel(text=state.broadcast.text, mean=state.pooled.mean,
                                   scale=state.pooled.scale)
        return result

    def final_message(self, result: Any, device_id: int) -> Message | None:
        return None if self.inner is None else self.inner.final_message(result, device_id)

    def late_request(self, result: Any) -> Request:
        """The late devices' request: the algorithm's first action, carrying what they missed."""
        return Request(round=0, action=next(iter(self.reply_types)), payload=self._late)

    def run_extra(self, state: _CompositeState) -> dict[str, Any]:
        """The schema, the fitted preprocessing and what rebuilds the model (``model.npz``)."""
        p = state.pooled
        if p is None:
            return {}
        if self.site_ids == "name":   # by id: the sites that sent their schema
            ids = sorted(state.names)
            by_id = {"sites": [state.names[z] for z in ids],
                     "site_rows": [state.sizes.get(z, 0) for z in ids], "device_ids": ids}
        else:
            n_dev = max(state.names) + 1 if state.names else 0
            by_id = {"sites": [state.names.get(z, f"device {z}") for z in range(n_dev)],
                     "site_rows": [state.sizes.get(z, 0) for z in range(n_dev)]}
        return {"preprocess": {"impute": self.impute, "scale": self.scaling,
                               "columns": list(state.schema.columns), "mean": p.mean.tolist(),
                               "var": p.var.tolist(), "scale_": p.scale.tolist(),
                               "count": p.count.tolist(), "n_rows": int(p.n_rows)},
                "schema": state.schema.to_json(), **by_id,
                "inner_config": state.inner_protocol.config(),
                "experiment": json.loads(self.experiment), "labels": self._request.labels,
                **self._privacy_extra(state)}

    def _received(self, X: Any, where: str) -> "TransformReceived":
        """The acknowledgement: the site's row count, or 1 under privacy (kept on the site)."""
        from .schema_round import as_table

        rows = 1 if self._request.private else as_table(X, where).n_rows
        return TransformReceived(n_rows=np.asarray(rows, np.int64))

    def _privacy_extra(self, state: _CompositeState) -> dict[str, Any]:
        """With privacy: the preprocessing's release and the algorithm's record, whose
        releases list the preprocessing's first (composed within the one ε)."""
        plan = state.moments_protocol.plan
        if plan is None:
            return {}
        pre = dict(plan.summary(), budget_share=float(
            json.loads(self.experiment)["preprocess_privacy"]["budget_share"]))
        inner = getattr(state.inner_protocol, "plan", None)
        return {"privacy": {"preprocess": pre,
                            "algorithm": None if inner is None else inner.summary()}}

    def write_outputs(self, out: RunOutput, extra: Mapping[str, Any], directory: Any) -> Any:
        """``directory/model.npz`` of the run (as ``fedclust run`` writes it), or None."""
        import copy
        from dataclasses import replace

        from .algorithm import save_run_model

        kept = getattr(out, "summaries", None)
        if kept is not None:   # the algorithm's rounds only: the site rounds are this wrapper's
            own = set(type(self).reply_types)
            out = copy.copy(out)
            out.summaries = replace(kept, rounds=[r for r in kept.rounds if r.action not in own])
        return save_run_model(out, extra, directory)

    # -- site -----------------------------------------------------------------------------
    def _built(self, text: Any, where: str) -> tuple[Any, Protocol, Any]:
        """(schema, the algorithm's protocol, a preprocessor) of a stored schema broadcast."""
        from .preprocess import FederatedPreprocessor
        from . import SiteSchema
        from .schema_round import array_text

        key = bytes(np.asarray(text, np.uint8))
        if key not in self._cache:
            d = array_text(text, where)
            schema = SiteSchema.from_json(d["schema"])
            inner = protocol_from_config(self.inner_name, d["inner"])
            self._cache = {key: (schema, inner, FederatedPreprocessor(self.impute, self.scaling))}
        return self._cache[key]

    def policy_view(self, state: Mapping[str, np.ndarray], payload: Any = None) -> Any:
        """This run as the site's device policy checks it
        (:class:`~fedclust.sites.site_policy.SitePolicyView`), from the schema the site
        stored (or a late site's request ``payload``)."""
        from .algorithm import preprocess_protocol
        from .site_policy import site_view

        text = payload.text if isinstance(payload, LateSiteModel) else state.get(_TEXT)
        parts: list[Any] = []
        if text is not None:
            schema, inner, _ = self._built(text, "site")
            parts = [preprocess_protocol(json.loads(self.experiment), self.impute, self.scaling,
                                         schema.columns), inner]
        return site_view(self, parts, (_SCHEMA_UP, _SCHEMA_DOWN, _STORE))

    def _site(self, state: Mapping[str, np.ndarray], where: str) -> tuple[Any, Protocol, Any]:
        """(schema, the algorithm's protocol, the pooled transform) this site stored."""
        if _TEXT not in state or _MEAN not in state:
            raise ValidationError(f"{where}: no schema or pooled transform stored; the "
                                  "preprocessing rounds did not reach this site")
        schema, inner, pre = self._built(state[_TEXT], where)
        m, s = np.asarray(state[_MEAN], np.float64), np.asarray(state[_SCALE], np.float64)
        pre._set(m, s ** 2, s, np.zeros(len(m), np.int64), 0, schema.columns)
        return schema, inner, pre

    def _schema(self, state: Mapping[str, np.ndarray], where: str) -> Any:
        from . import SiteSchema
        from .schema_round import array_text

        if _TEXT not in state:
            raise ValidationError(f"{where}: no schema stored; the schema round did not reach "
                                  "this site")
        return SiteSchema.from_json(array_text(state[_TEXT], where)["schema"])

    def encode(self, data: Any, schema: Any, where: str, unknown: str = "error"
               ) -> tuple[np.ndarray, Any, str]:
        """Raw site data -> (encoded X with NaN, labels or None, the file's name)."""
        from . import encode_table, label_indices, label_values
        from .schema_round import as_table

        table = as_table(data, where)
        X = encode_table(table, schema, unknown)
        y = None
        if schema.label is not None and self.supervised:
            y = label_values(table, schema.label)
            y = (label_indices(y, schema.classes, table.path, schema.label)
                 if schema.classes is not None else np.asarray(y, np.float64))
        return X, y, table.path

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        from .preprocess import ACTION, SQUARES, SUMS
        from .algorithm import preprocess_protocol
        from .schema_round import as_table, site_columns

        where = f"device {device_id}"
        if request.action == _SCHEMA_UP:
            return site_columns(as_table(X, where), self._request, self.impute)
        if request.action == _SCHEMA_DOWN:
            if request.payload is None:
                raise ValidationError(f"{where}: the schema broadcast has no payload")
            state[_TEXT] = np.asarray(request.payload.text, np.uint8)
            self._schema(state, where)  # readable
            return self._received(X, where)
        if request.action in (ACTION, SUMS, SQUARES):
            schema = self._schema(state, where)
            E, _, path = self.encode(X, schema, where)
            moments = preprocess_protocol(json.loads(self.experiment), self.impute,
                                          self.scaling, schema.columns)
            own: dict[str, np.ndarray] = {}
            try:
                reply = moments.client_step(request, E, device_id=device_id, seed=seed,
                                            state=own)
            except ValidationError as exc:  # name the file, not the device
                raise ValidationError(str(exc).replace(where, path, 1)) from None
            if "n_clipped" in own:  # values clipped to the public ranges (privacy)
                state[_CLIPPED] = own["n_clipped"]
            return reply
        if request.action == _STORE:
            schema = self._schema(state, where)
            p = request.payload
            d = len(schema.columns)
            if p is None or p.mean.shape != (d,) or p.scale.shape != p.mean.shape:
                raise ValidationError(f"{where}: the pooled transform must have {d} means "
                                      "and scales")
            state[_MEAN] = np.asarray(p.mean, np.float64)
            state[_SCALE] = np.asarray(p.scale, np.float64)
            return self._received(X, where)
        if isinstance(request.payload, LateSiteModel):  # a late site: what it missed
            state[_TEXT] = np.asarray(request.payload.text, np.uint8)
            state[_MEAN] = np.asarray(request.payload.mean, np.float64)
            state[_SCALE] = np.asarray(request.payload.scale, np.float64)
            state[_LATE] = np.asarray(1, np.int64)
            request = Request(round=request.round, action=request.action)
        schema, inner, pre = self._site(state, where)
        inner_state = {k: v for k, v in state.items() if k not in _MINE}
        reply = inner.client_step(request, self.local_data(X, schema, pre, where, state),
                                  device_id=device_id, seed=seed, state=inner_state)
        state.update(inner_state)
        return reply

    def local_data(self, data: Any, schema: Any, pre: Any, where: str,
                   state: Mapping[str, np.ndarray] = {}) -> Any:
        """Raw site data -> the algorithm's input: ``X`` or ``(X, y)``, preprocessed.

        A late site (it missed the schema round) reads a category the schema does
        not know as a missing value, imputed like any missing cell."""
        X, y, path = self.encode(data, schema, where, "missing" if _LATE in state else "error")
        X = pre.transform(X, where=path)
        if self.supervised:
            if y is None:
                raise ValidationError(f"{path}: the algorithm needs labels; the site has none")
            return X, y
        return X

    def client_finish(self, message: Message | None, X: Any, state: dict[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
        if _TEXT not in state or _MEAN not in state:  # absent from the run: no output
            return {}
        schema, inner, pre = self._site(state, "site")
        inner_state = {k: v for k, v in state.items() if k not in _MINE}
        out = inner.client_finish(message, self.local_data(X, schema, pre, "site", state),
                                  inner_state)
        if _CLIPPED in state:
            out = {**out, "preprocess_n_clipped": state[_CLIPPED]}
        return out

    def node_data(self, data: Any, where: str) -> Any:
        """The site's file as it is: every round encodes and preprocesses it on the node."""
        return data

    def __getattr__(self, name: str) -> Any:
        # optional hooks of the algorithm's protocol (assign_late, ...), once it is built
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)


def _own_reply_types() -> None:
    from .preprocess import ACTION, SQUARES, SUMS, ColumnMoments, ColumnSquares, ColumnSums
    from .schema_round import SiteColumns

    SitePreprocessProtocol.reply_types = {_SCHEMA_UP: SiteColumns,
                                          _SCHEMA_DOWN: TransformReceived,
                                          ACTION: ColumnMoments, SUMS: ColumnSums,
                                          SQUARES: ColumnSquares, _STORE: TransformReceived}


_own_reply_types()


@dataclass
class _InnerResult:  # placeholder type: results are saved under the inner protocol's type
    pass


register_protocol(SitePreprocessProtocol, _InnerResult)
