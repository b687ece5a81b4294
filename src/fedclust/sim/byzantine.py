"""Byzantine devices for the simulator: liars on the wire, and poisoned data.

Two threat models (Ghosh, Hong, Yin & Ramchandran 2019, §4.3):

* **Liars on the wire** — :class:`ByzantineTamper` is a ``tamper(device_id,
  round, arrays) -> arrays`` hook for :class:`~fedclust.sim.InProcessTransport`
  and the Flower transports (the ClientApp accepts the same callable; a Flower
  simulation rebuilds it in its client process from :meth:`ByzantineTamper.config`). A fraction
  ``alpha`` of the devices, drawn from the run's seed, replace the *float*
  fields of every reply they send. The hook is generic over message arrays, so
  the same attacks hit k-FED's local centres, coresets, Gaussian statistics and
  model parameters alike. Messages stay well-formed: shapes and dtypes are
  kept, values stay finite, integer fields (point counts, indices) are left as
  the honest device computed them — the attack is extreme values, which the
  protocol must survive, not malformed messages, which it already rejects.
* **Data poisoning** — :func:`poison_devices` rewrites the data of a fraction
  of devices before the run; they then follow the protocol honestly on
  adversarial data.

Attacks on the wire (``attack=``):

``"large-norm"``   i.i.d. ``N(0, scale²)`` entries (fresh per device and round);
``"sign-flip"``    ``-scale * honest`` (``scale=1``: the plain sign flip);
``"scale"``        ``scale * honest``;
``"collude"``      every liar sends the same point ``target`` (default: one
                   random vector of norm ``scale`` drawn from the seed) in every row;
``"between"``      every row on the segment between ``between=(a, b)`` (e.g. two
                   true cluster centres), at a position drawn per device.

``collude`` with a ``target`` and ``between`` rewrite only the float fields
whose rows have the length of the given point(s); other fields (a scalar loss
beside a parameter vector) stay honest.

The liars are drawn from the server stream ``server_rng(seed, 11)`` (round
index 11 is reserved for this draw, as 7 is for dropout), so the same seed
picks the same liars on every transport and in every device order. Random
attack values come from a per-(device, round) stream of their own.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.random import RandomState, root_seed, server_rng
from ..core.validation import check_choice, check_float

__all__ = ["ByzantineTamper", "choose_byzantine", "poison_devices", "ATTACKS", "POISONS",
           "BYZANTINE_ROUND"]

ATTACKS = ("large-norm", "sign-flip", "scale", "collude", "between")
POISONS = ("shift", "noise", "regression", "label-flip", "coordinated")

#: server-stream round index reserved for drawing the Byzantine devices
BYZANTINE_ROUND = 11
_ATTACK_BRANCH = 11  # SeedSequence spawn-key branch of the liars' own random values


def _check_alpha(alpha: Any) -> float:
    alpha = check_float(alpha, "alpha", min_value=0.0)
    if alpha >= 0.5:
        raise ValidationError(f"alpha={alpha} must be < 0.5 (Byzantine devices must be a minority)")
    return alpha


def choose_byzantine(device_ids: Sequence[int], alpha: float, seed: int) -> list[int]:
    """The ``round(alpha * n)`` Byzantine devices among ``device_ids`` (sorted), from the seed.

    Independent of the order of ``device_ids``.
    """
    alpha = _check_alpha(alpha)
    ids = sorted(int(z) for z in device_ids)
    if not ids:
        return []
    perm = server_rng(int(seed), BYZANTINE_ROUND).permutation(ids)
    return sorted(int(z) for z in perm[:int(round(alpha * len(ids)))])


class ByzantineTamper:
    """A tamper hook that makes a fraction of devices lie (see the module docstring).

    Parameters
    ----------
    device_ids : sequence of int
        The federation's device ids (the liars are drawn among them).
    alpha : float
        Fraction of Byzantine devices, ``0 <= alpha < 0.5``.
    random_state : int, Generator or None
        Use the run's seed to tie the liars to the run.
    attack : str, default="large-norm"
        One of :data:`ATTACKS`.
    scale : float, default=100.0
        Size of the lie (standard deviation, factor or norm; see above).
    target : array-like (p,), optional
        The common point of ``"collude"`` (last axis of each float field).
    between : pair of array-like (p,), optional
        The two end points of ``"between"`` (required for it).
    fields : sequence of str, optional
        Float fields to rewrite (default: every float field).
    devices : sequence of int, optional
        Explicit liars (replaces the draw from ``alpha``).

    Attributes
    ----------
    byzantine : list of int
        The lying devices.
    calls : int
        Replies rewritten so far.
    """

    def __init__(self, device_ids: Sequence[int], alpha: float = 0.1,
                 random_state: RandomState = None, *, attack: str = "large-norm",
                 scale: float = 100.0, target: Any = None, between: Any = None,
                 fields: Sequence[str] | None = None, devices: Sequence[int] | None = None):
        self.attack = check_choice(attack, "attack", ATTACKS)
        self.scale = check_float(scale, "scale")
        self.seed = root_seed(random_state)
        ids = [int(z) for z in device_ids]
        if devices is not None:
            unknown = sorted(set(int(z) for z in devices) - set(ids))
            if unknown:
                raise ValidationError(f"Byzantine devices {unknown[:5]} are not in the federation")
            self.byzantine = sorted(set(int(z) for z in devices))
        else:
            self.byzantine = choose_byzantine(ids, alpha, self.seed)
        self._liars = set(self.byzantine)
        self.target = None if target is None else np.asarray(target, dtype=np.float64).ravel()
        if self.attack == "between":
            if between is None or len(between) != 2:
                raise ValidationError("attack='between' needs between=(a, b), two end points")
            self.between = tuple(np.asarray(e, dtype=np.float64).ravel() for e in between)
            if self.between[0].shape != self.between[1].shape:
                raise ValidationError(
                    f"between end points have shapes {self.between[0].shape} and "
                    f"{self.between[1].shape}")
        else:
            self.between = None
        self.fields = None if fields is None else tuple(fields)
        self.calls = 0

    def config(self) -> dict[str, Any]:
        """JSON scalars and lists from which :meth:`from_config` rebuilds the same liars and
        lies (how the hook reaches the clients of a Flower simulation in another process)."""
        vec = lambda a: None if a is None else [float(v) for v in a]
        return {"byzantine": list(self.byzantine), "seed": int(self.seed), "attack": self.attack,
                "scale": float(self.scale), "target": vec(self.target),
                "between": None if self.between is None else [vec(e) for e in self.between],
                "fields": None if self.fields is None else list(self.fields)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ByzantineTamper":
        """The hook :meth:`config` describes."""
        liars = [int(z) for z in config["byzantine"]]
        return cls(liars, 0.0, int(config["seed"]), attack=config["attack"],
                   scale=config["scale"], target=config.get("target"),
                   between=config.get("between"), fields=config.get("fields"), devices=liars)

    def is_byzantine(self, device_id: int) -> bool:
        return int(device_id) in self._liars

    def _rng(self, device_id: int, round_index: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(
            self.seed, spawn_key=(_ATTACK_BRANCH, int(device_id), int(round_index))))

    def _point(self, p: int, round_index: int) -> np.ndarray:
        """The colluders' common point (p,): ``target`` or a seeded vector of norm ``scale``."""
        if self.target is not None:
            return self.target
        # one point for every liar and round (keyed by the seed and the row length only)
        v = np.random.default_rng(np.random.SeedSequence(
            self.seed, spawn_key=(_ATTACK_BRANCH + 2, int(p)))).normal(size=p)
        return self.scale * v / max(np.linalg.norm(v), 1e-300)

    def applies_to(self, value: np.ndarray) -> bool:
        """Whether the attack rewrites this float field: ``collude`` with a ``target`` and
        ``between`` only touch fields whose rows have the given point's length (e.g. the
        parameter vector, not the scalar loss beside it)."""
        p = value.shape[-1] if value.ndim else 1
        if self.attack == "between":
            return self.between[0].shape == (p,)
        if self.attack == "collude" and self.target is not None:
            return self.target.shape == (p,)
        return True

    def lie(self, device_id: int, round_index: int, value: np.ndarray) -> np.ndarray:
        """The lie replacing one float array (same shape and dtype, finite)."""
        a = np.asarray(value, dtype=np.float64)
        p = a.shape[-1] if a.ndim else 1
        if self.attack == "large-norm":
            out = self.scale * self._rng(device_id, round_index).normal(size=a.shape)
        elif self.attack == "sign-flip":
            out = -self.scale * a
        elif self.attack == "scale":
            out = self.scale * a
        elif self.attack == "collude":
            out = np.broadcast_to(self._point(p, round_index), a.shape) if a.ndim else np.asarray(
                self._point(1, round_index)[0])
        else:
            lo, hi = self.between
            t = self._rng(device_id, round_index).uniform(0.25, 0.75)
            row = (1 - t) * lo + t * hi
            out = np.broadcast_to(row, a.shape) if a.ndim else np.asarray(row[0])
        dtype = value.dtype if isinstance(value, np.ndarray) else np.float64
        big = np.finfo(dtype).max / 16
        # np.asarray keeps 0-d fields 0-d (ascontiguousarray would make them 1-d)
        return np.asarray(np.clip(out, -big, big), dtype=dtype, order="C").reshape(a.shape)

    def __call__(self, device_id: int, round_index: int,
                 arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if int(device_id) not in self._liars:
            return arrays
        out = dict(arrays)
        for name, value in arrays.items():
            if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
                continue  # integer fields (counts, ids) stay honest: the message stays well-formed
            if (self.fields is not None and name not in self.fields) or not self.applies_to(value):
                continue
            out[name] = self.lie(device_id, round_index, value)
        self.calls += 1
        return out


def poison_devices(devices: Sequence[Any], alpha: float, random_state: RandomState = None, *,
                   attack: str = "shift", scale: float = 10.0,
                   device_ids: Sequence[int] | None = None,
                   n_classes: int | None = None,
                   target: Any = None) -> tuple[list[Any], list[int]]:
    """Data poisoning: a fraction ``alpha`` of devices hold adversarial data.

    ``devices`` are arrays X (n_z, d) or pairs (X, y). Returns the new list
    (honest devices unchanged, the same objects) and the poisoned device ids.
    Attacks (:data:`POISONS`):

    - ``"shift"``: X + scale · u, u a random unit vector per device;
    - ``"noise"``: X replaced by N(0, scale²) points;
    - ``"regression"``: (X, y) with y = X w_adv, w_adv ~ N(0, scale²) (arbitrary ERMs);
    - ``"label-flip"``: (X, y) with y -> n_classes - 1 - y;
    - ``"coordinated"``: colluders with data of their own, agreeing on one point
      ``target`` (default: one random vector of norm ``scale`` drawn from the
      seed, shared by every poisoned device). X only: ``X - mean(X) + target``
      (each keeps its own shape, so no two reports coincide); (X, y): X kept and
      ``y = X w_target + b + r``, b the device's own intercept and r its own
      least-squares residuals in a random order, rescaled to the noise's size
      (``sqrt(n / (n - rank))``), ``target`` the coefficients (no intercept column).

    The poisoned devices are :func:`choose_byzantine` of the ids (so the same
    seed poisons the same devices a tamper hook would make lie).
    """
    check_choice(attack, "attack", POISONS)
    scale = check_float(scale, "scale")
    seed = root_seed(random_state)
    ids = list(range(len(devices))) if device_ids is None else [int(z) for z in device_ids]
    if len(ids) != len(devices):
        raise ValidationError(f"{len(devices)} devices but {len(ids)} device_ids")
    bad = choose_byzantine(ids, alpha, seed)
    out = list(devices)
    shared = None
    if attack == "coordinated":
        p = np.asarray(devices[0][0] if isinstance(devices[0], tuple) else devices[0]).shape[1]
        if target is not None:
            shared = np.asarray(target, dtype=np.float64).ravel()
            if shared.shape != (p,):
                raise ValidationError(f"target has shape {shared.shape}; the data has {p} features")
        else:
            v = np.random.default_rng(np.random.SeedSequence(
                seed, spawn_key=(_ATTACK_BRANCH + 3, p))).normal(size=p)
            shared = scale * v / max(float(np.linalg.norm(v)), 1e-300)
    for pos, z in enumerate(ids):
        if z not in bad:
            continue
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_ATTACK_BRANCH + 1, z)))
        data = devices[pos]
        supervised = isinstance(data, tuple)
        X = np.asarray(data[0] if supervised else data, dtype=np.float64)
        if attack in ("regression", "label-flip") and not supervised:
            raise ValidationError(f"attack={attack!r} needs (X, y) devices; device {z} holds X only")
        if attack == "shift":
            u = rng.normal(size=X.shape[1])
            X = X + scale * u / np.linalg.norm(u)
        elif attack == "noise":
            X = scale * rng.normal(size=X.shape)
        elif attack == "coordinated" and not supervised:
            X = X - X.mean(axis=0) + shared
        if attack == "coordinated" and supervised:
            y = np.asarray(data[1], dtype=np.float64)
            # the device's own residuals, shuffled: honest-sized noise that is not
            # orthogonal to X, so the liars' ERMs scatter around the target like honest ones.
            # A least-squares fit's residuals are smaller than the noise (E|r|^2 = (n - q)
            # sigma^2 for q fitted columns): rescaled to the noise's size, or the liars'
            # ERMs would gather tighter than honest ones
            A = np.hstack([X, np.ones((X.shape[0], 1))])
            fit = np.linalg.lstsq(A, y, rcond=None)
            resid = y - A @ fit[0]
            free = X.shape[0] - int(fit[2])
            if free > 0:
                resid = resid * np.sqrt(X.shape[0] / free)
            y = X @ shared + fit[0][-1] + rng.permutation(resid)
        elif attack == "regression":
            y = X @ (scale * rng.normal(size=X.shape[1]))
        elif attack == "label-flip":
            y = np.asarray(data[1])
            C = int(n_classes) if n_classes is not None else int(y.max()) + 1
            y = (C - 1 - y).astype(y.dtype)
        else:
            y = data[1] if supervised else None
        out[pos] = (X, y) if supervised else X
    return out, bad
