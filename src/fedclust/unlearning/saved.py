"""The kept device summaries in ``model.npz`` (arrays + JSON, no pickle) and the CLI's forget.

``fedclust run`` saves, beside the model, what the server keeps to forget a site
without it online: every round's replies (``forget/<round>/<device>/<field>``
arrays) and a JSON header entry ``"unlearning"`` (the estimator's parameters,
the protocol's name and config, the seed, the device ids and site names, the
rounds, the digests, the forget records). ``fedclust forget model.npz --site
NAME`` rebuilds the server side from them, forgets the site and writes the
new model with the site's summaries gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..configured import register_forget_section
from ..core.exceptions import ValidationError
from .forget import ForgetRecord, Unlearning
from .replay import DevicesNeeded
from .store import SummaryStore

__all__ = ["PREFIX", "ForgettableModel", "saved_section", "forget_saved_model", "load_forgettable"]

PREFIX = "forget/"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def saved_section(model: Any, site_names: Sequence[str] = ()
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """``(arrays, meta)`` to save with the model, or None when the server kept no summaries
    (secure aggregation, a general graph, an estimator without ``forget``)."""
    u = getattr(model, "_unlearning_", None)
    if u is None or not u.store.complete:
        return None
    config = u.protocol.config()
    if not _jsonable(config):
        return None
    arrays, store_meta = u.store.to_arrays(PREFIX)
    ids = list(getattr(model, "device_ids_", u.store.device_ids))
    names = dict(u.names)
    if site_names:
        names = {str(n): int(z) for n, z in zip(site_names, ids)}
    meta = {"estimator": type(model).__name__,
            "params": {k: v for k, v in model.get_params(deep=False).items()
                       if _jsonable(v) and k != "progress"},
            "protocol": u.protocol.name, "config": config, "seed": u.seed,
            "device_ids": ids, "names": names, "store": store_meta,
            "records": [r.to_json() for r in getattr(model, "forget_log_", [])]}
    return arrays, meta


def _restore(algorithm: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
    from ..core.registry import protocol_from_config

    model = algorithm.estimator(**meta["params"])
    protocol = protocol_from_config(meta["protocol"], meta["config"])
    store = SummaryStore.from_arrays(arrays, meta["store"], PREFIX)
    model._unlearning_ = Unlearning(protocol, int(meta["seed"]), store, None,
                                    names={str(n): int(z) for n, z in meta["names"].items()})
    model.seed_ = int(meta["seed"])
    model.device_ids_ = [int(z) for z in meta["device_ids"]]
    model.device_labels_ = [None] * len(model.device_ids_)
    model.communication_ = {}
    model.forget_log_ = [ForgetRecord.from_json(r) for r in meta.get("records", [])]
    if "classes" in meta["config"]:   # the classifier's label set (a data-derived setting)
        model.classes_ = np.asarray(meta["config"]["classes"])
    return model


def forget_saved_model(path: str | Path, sites: Sequence[str], out: str | Path | None = None
                       ) -> tuple[Path, ForgetRecord]:
    """Forget training sites of a saved ``model.npz``; writes ``out`` (default: in place).

    The departed sites need not be online: the server's kept summaries of the
    others suffice for the one-shot families. Refused, in one line, where the
    saved model cannot be updated exactly from what it holds.
    """
    path = Path(path)
    saved = load_forgettable(path)
    unknown = [s for s in sites if s not in saved.names]
    if unknown:
        raise ValidationError(f"{path}: no training site named {unknown[0]!r}; sites: "
                              f"{sorted(saved.names)[:10]}")
    try:
        saved.model.forget(devices=list(sites), relabel=False)
    except DevicesNeeded:
        raise ValidationError(
            f"{path}: forgetting {', '.join(sites)} changes what the server asks the other "
            f"sites ({saved.algorithm} has rounds after the first), so every site must "
            "compute again; run again without the site") from None
    return saved.write(out), saved.model.forget_log_[-1]


class ForgettableModel:
    """A saved ``model.npz`` restored with its kept summaries (:func:`load_forgettable`):
    ``model`` has ``forget``; :meth:`write` saves it again without the forgotten sites."""

    def __init__(self, path: Path, saved: Any, model: Any, names: dict[str, int]):
        self.path, self.saved, self.model, self.names = path, saved, model, names
        self.algorithm = saved.header["algorithm"]

    def write(self, out: str | Path | None = None) -> Path:
        from ..core.registry import get_algorithm
        from ..sites.files_out import save_model

        header = self.saved.header
        present = set(self.model._unlearning_.store.device_ids)
        remaining = [n for n in header.get("sites", [])
                     if n not in self.names or self.names[n] in present]
        algorithm = get_algorithm(self.algorithm)
        exported = algorithm.export(self.model, None)
        section = saved_section(self.model, remaining)
        target = Path(out) if out is not None else self.path
        save_model(target, exported, algorithm=self.algorithm,
                   preprocessor=self.saved.preprocessor, schema=self.saved.schema,
                   columns=self.saved.columns, sites=remaining, unlearning=section)
        return target


def load_forgettable(path: str | Path) -> ForgettableModel:
    """Read a saved ``model.npz`` with the device summaries kept for forgetting; refused
    in one line where a forget could not be exact from what it holds."""
    from ..core.registry import get_algorithm
    from ..sites.files_out import load_model

    path = Path(path)
    saved = load_model(path)
    header = saved.header
    meta = header.get("unlearning")
    if not meta:
        raise ValidationError(f"{path}: the model was saved without the device summaries "
                              "forgetting needs (secure aggregation, a general graph, or a "
                              "family without forget); run again without the site")
    pre = header.get("preprocess") or {}
    if pre and (pre.get("impute") != "none" or pre.get("scale") != "none"):
        raise ValidationError(
            f"{path}: the pooled preprocessing includes every site's moments, so forgetting a "
            "site changes every site's preprocessed rows and all of them must compute again; "
            "run again without the site")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k.startswith(PREFIX)}
    model = _restore(get_algorithm(header["algorithm"]), arrays, meta)
    return ForgettableModel(path, saved, model, {str(n): int(z)
                                                 for n, z in meta["names"].items()})


register_forget_section(saved_section)
