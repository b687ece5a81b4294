"""A device's own policy: what it answers, whatever the server asks.

The server builds every request; a device that does what a request says is
as safe as the server is honest. A :class:`DevicePolicy` is set on the device
(in process: ``InProcessTransport(policies=...)``; on Flower: the SuperNode's
node config, :meth:`DevicePolicy.from_node_config`) and checked on the device
before it touches its data:

* ``secure_aggregation``: ``"required"`` or ``"signed"`` — a plain request for
  a round the protocol can sum securely is refused (``"signed"``: the device
  also needs its identity key; a node with an identity key is ``"signed"``);
* the secure sum's group and threshold: the device computes the threshold from
  the size of the group it is given (:func:`group_threshold`) and refuses a
  group below ``min_group`` or one whose threshold ``max_colluders`` devices
  could reach; it never takes either from the request;
* ``allow_noise_seed`` (default off): a private protocol whose noise seed the
  server chose is refused (a known seed makes the noise removable);
* ``allow_collect`` (default off): per-point outputs are not sent back;
* ``actions``: protocol name -> the actions this device answers (``"fedclust_forget"``:
  the device may send its own forget request, :mod:`fedclust.flower.forget`);
* ``epsilon`` / ``delta``: the device's privacy budget, kept in its own
  :class:`PrivacyLedger` (a JSON file on the device when ``ledger`` is set).
  A fit is charged once, at its first data request, with the Gaussian releases
  its protocol declares, composed by ``dp-accounting`` with everything charged
  before; a fit that would pass the budget is refused, as is a protocol
  without differential privacy. Sampling amplification is not counted: the
  device cannot know whether the server saw who was sampled.
* the rounds of a private fit: the device counts the data requests it answers
  per fit and refuses one past the rounds its protocol declares for that action
  (``protocol.declared_rounds()``, computed from the public config; a protocol
  without it: at most the sum of its plan's release repeats), and a second
  request of a (round, action) pair it already answered — each would be a
  release its ledger never charged.

A refusal is a :class:`PolicyRefusal`: one line that starts with the device
id, which the server's run log keeps (``log.failed``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .exceptions import ValidationError

__all__ = ["DevicePolicy", "PolicyRefusal", "PrivacyLedger", "group_threshold", "policy_for",
           "write_private_atomic", "SECURE_MODES"]

SECURE_MODES = ("any", "required", "signed")
FORGET_ACTION = "fedclust_forget"  # a device's own forget request (unlearning on Flower)
_CHARGED = "policy.charged"  # device state entry: fingerprints of the fits already charged
_ANSWERED = "policy.answered."  # + a fit's fingerprint: the (round, action) pairs it answered


class PolicyRefusal(ValidationError):
    """A device refuses a request under its own policy (one line naming the device)."""


def group_threshold(group_size: int) -> int:
    """The secure sum's threshold for a group of ``group_size`` (including the device):
    ``g - floor(g / 3)``, at least a strict majority, so ``2 t > g``."""
    g = int(group_size)
    return max(g - g // 3, g // 2 + 1)


@dataclass(frozen=True)
class DevicePolicy:
    """What a device agrees to; see the module docstring.

    Parameters
    ----------
    secure_aggregation : {"any", "required", "signed"}, default="any"
        The secure-aggregation mode the device insists on for summable rounds.
    min_group : int, default=2
        The smallest secure-sum group (the device included) it shares secrets in.
    max_colluders : int, default=0
        Devices that may collude with the server; a group whose threshold
        they could reach is refused.
    allow_noise_seed : bool, default=False
        Accept a private protocol whose noise seed is set (tests only: a known
        seed voids the guarantee).
    allow_collect : bool, default=False
        Send per-point outputs (labels) back when the server asks for them.
    actions : mapping of str to collection of str, optional
        Protocol name -> actions the device answers; ``None``: any.
    epsilon : float, optional
        The device's privacy budget (all fits together); ``None``: no ledger.
    delta : float, default=1e-6
        The δ at which ``epsilon`` is measured.
    ledger : str, optional
        JSON file of the device's ledger (kept across runs); ``None``: in memory.
        ``{device}`` in it is replaced by the device id (one policy for several
        simulated devices).
    accountant : {"pld", "rdp"}, default="pld"
        ``dp-accounting``'s accountant for the composition.
    """

    secure_aggregation: str = "any"
    min_group: int = 2
    max_colluders: int = 0
    allow_noise_seed: bool = False
    allow_collect: bool = False
    actions: Mapping[str, frozenset[str]] | None = None
    epsilon: float | None = None
    delta: float = 1e-6
    ledger: str | None = None
    accountant: str = "pld"
    _memory: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if self.secure_aggregation not in SECURE_MODES:
            raise ValidationError(f"policy: secure_aggregation={self.secure_aggregation!r} "
                                  f"must be one of {SECURE_MODES}")
        if int(self.min_group) < 2:
            raise ValidationError(f"policy: min_group={self.min_group} must be >= 2 (a sum of "
                                  "one reply is that reply)")
        if int(self.max_colluders) < 0:
            raise ValidationError(f"policy: max_colluders={self.max_colluders} must be >= 0")
        if self.epsilon is not None and not float(self.epsilon) > 0:
            raise ValidationError(f"policy: epsilon={self.epsilon} must be > 0")
        if not 0 < float(self.delta) < 1:
            raise ValidationError(f"policy: delta={self.delta} must be in (0, 1)")
        if self.accountant not in ("pld", "rdp"):
            raise ValidationError(f"policy: accountant={self.accountant!r} must be 'pld' or "
                                  "'rdp'")
        if self.actions is not None:
            object.__setattr__(self, "actions", {str(p): frozenset(str(a) for a in acts)
                                                 for p, acts in dict(self.actions).items()})

    # -- node config (Flower) ------------------------------------------------
    _KEYS = {"policy-secure-aggregation": "secure_aggregation", "policy-min-group": "min_group",
             "policy-max-colluders": "max_colluders",
             "policy-allow-noise-seed": "allow_noise_seed",
             "policy-allow-collect": "allow_collect", "policy-actions": "actions",
             "policy-epsilon": "epsilon", "policy-delta": "delta", "policy-ledger": "ledger",
             "policy-accountant": "accountant"}

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> "DevicePolicy":
        """The policy of a SuperNode's ``--node-config`` (``policy-*`` keys; ``policy-actions``
        is JSON text ``{"protocol": ["action", ...]}``); defaults for missing keys."""
        kw: dict[str, Any] = {}
        for key, name in cls._KEYS.items():
            if key not in node_config:
                continue
            v = node_config[key]
            if name == "actions":
                try:
                    v = json.loads(str(v))
                except ValueError as exc:
                    raise ValidationError(f"node config {key}: not JSON ({exc})") from None
            elif name in ("min_group", "max_colluders"):
                v = int(v)
            elif name in ("allow_noise_seed", "allow_collect"):
                v = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
            elif name in ("epsilon", "delta"):
                v = float(v)
            else:
                v = str(v)
            kw[name] = v
        return cls(**kw)

    def to_node_config(self) -> dict[str, Any]:
        """The ``policy-*`` node config entries of this policy (inverse of the above)."""
        out: dict[str, Any] = {}
        for key, name in self._KEYS.items():
            v = getattr(self, name)
            if v is None:
                continue
            out[key] = (json.dumps({p: sorted(a) for p, a in v.items()}) if name == "actions"
                        else v)
        return out

    def at_least_signed(self) -> "DevicePolicy":
        """The policy of a device that holds a secure-aggregation identity key."""
        if self.secure_aggregation == "signed":
            return self
        from dataclasses import replace

        return replace(self, secure_aggregation="signed", _memory=self._memory)

    # -- checks ----------------------------------------------------------------
    def min_group_size(self) -> int:
        """The smallest group this device accepts (``min_group``, and large enough that
        ``max_colluders`` stay below the threshold)."""
        g = int(self.min_group)
        while group_threshold(g) <= int(self.max_colluders):
            g += 1
        return g

    def check_group(self, group_size: int, device: str) -> int:
        """The threshold of a group of ``group_size``; refuses a group below the minimum."""
        need = self.min_group_size()
        if int(group_size) < need:
            raise PolicyRefusal(f"{device}: refuses a secure-aggregation group of "
                                f"{int(group_size)} device(s) (minimum {need} by its policy: "
                                f"min_group={self.min_group}, max_colluders="
                                f"{self.max_colluders})")
        return group_threshold(group_size)

    def check_request(self, protocol: Any, action: str, state: dict, device: str, *,
                      secure: bool, round_index: int | None = None,
                      device_state: Mapping[str, Any] | None = None,
                      payload: Any = None) -> None:
        """Before a data request runs on the device (``secure``: it arrived as the
        ``mask`` stage of a secure sum). Charges the ledger on a fit's first request;
        with ``round_index`` (the request's round) a private fit's request is also
        counted against the rounds its protocol declares.

        A protocol made of several (a site run: schema, preprocessing, algorithm)
        shows the policy one view of the whole fit, built from the device's own
        protocol state (``device_state``) and the request's ``payload``
        (``protocol.policy_view``)."""
        view = getattr(protocol, "policy_view", None)
        if view is not None:
            protocol = view({} if device_state is None else device_state, payload)
        name = self._check_protocol(protocol, device)
        if self.actions is not None:
            allowed = self.actions[name]
            if action not in allowed:
                raise PolicyRefusal(f"{device}: refuses action {action!r} of protocol "
                                    f"{name!r}: its policy allows {sorted(allowed)}")
        if self.secure_aggregation != "any" and not secure:
            summable = getattr(_secure_form(protocol), "summed_actions", frozenset())
            if action in summable:
                raise PolicyRefusal(f"{device}: refuses a plain {action!r} request: its policy "
                                    f"requires secure aggregation ({self.secure_aggregation}) "
                                    "for the rounds the server only sums")
        privacy = getattr(protocol, "privacy", None)
        if (privacy is not None and getattr(privacy, "noise_seed", None) is not None
                and not self.allow_noise_seed):
            raise PolicyRefusal(f"{device}: refuses a private protocol whose noise seed the "
                                "server chose (a known seed makes the noise removable)")
        answered = None
        if round_index is not None and _private(protocol):
            answered = _check_rounds(protocol, name, action, int(round_index), state, device)
        if self.epsilon is not None:
            self._charge(protocol, name, state, device)
        if answered is not None:  # recorded once everything above accepted it
            answered.append([int(round_index), str(action)])
            state[_ANSWERED + _fingerprint(protocol)] = np.frombuffer(
                json.dumps(answered).encode(), np.uint8).copy()

    def _check_protocol(self, protocol: Any, device: str) -> str:
        name = getattr(protocol, "name", type(protocol).__name__)
        if self.actions is not None and name not in self.actions:
            raise PolicyRefusal(f"{device}: refuses protocol {name!r}: not in its "
                                f"policy's allowed protocols {sorted(self.actions)}")
        return name

    def check_finish(self, protocol: Any, collect: bool, device: str) -> None:
        """Before the final message: the protocol must be allowed, and per-point outputs
        go back only with ``allow_collect``."""
        self._check_protocol(protocol, device)
        if collect and not self.allow_collect:
            raise PolicyRefusal(f"{device}: refuses to send per-point outputs: its policy "
                                "has allow_collect off")

    def check_forget(self, protocol: Any, level: str, device: str) -> None:
        """Before the device sends its own forget request (``level``: ``"device"`` or
        ``"rows"``): the protocol must be allowed and, where ``actions`` is set, its
        ``"fedclust_forget"`` action too. A row-level request of a private protocol is
        refused: the device would release its summary a second time."""
        name = self._check_protocol(protocol, device)
        if self.actions is not None and FORGET_ACTION not in self.actions[name]:
            raise PolicyRefusal(f"{device}: refuses action {FORGET_ACTION!r} of protocol "
                                f"{name!r}: its policy allows {sorted(self.actions[name])}")
        if level == "rows" and getattr(protocol, "privacy", None) is not None:
            raise PolicyRefusal(f"{device}: refuses to release its summary again under "
                                "privacy= (two releases of neighbouring data with the same "
                                "noise reveal the deleted rows); ask to forget the whole device")

    def _charge(self, protocol: Any, name: str, state: dict, device: str) -> None:
        if _private(protocol) and getattr(protocol, "releases_pending", False):
            return  # a private fit whose releases the device learns with its schema
        fingerprint = _fingerprint(protocol)
        charged = set(np.asarray(state.get(_CHARGED, np.zeros(0, np.uint8))).tobytes()
                      .decode("ascii").split(",")) - {""}
        if fingerprint in charged:
            return
        events = _events(protocol, name, device)
        self.ledger_object(device).charge(events, f"{name} (fit {fingerprint})", device)
        charged.add(fingerprint)
        state[_CHARGED] = np.frombuffer(",".join(sorted(charged)).encode("ascii"),
                                        np.uint8).copy()

    def ledger_object(self, device: str) -> "PrivacyLedger":
        """The ledger of ``device`` ("device <id>"): one per device, also when simulated
        devices share this policy object (``ledger`` may hold ``{device}``, the id)."""
        if device not in self._memory:
            path = self.ledger
            if path is not None and "{device}" in path:
                path = path.replace("{device}", device.split()[-1])
            self._memory[device] = PrivacyLedger(self.epsilon, self.delta, path,
                                                 self.accountant)
        return self._memory[device]


def policy_for(policies: Any, device_id: int, default: DevicePolicy | None = None
               ) -> DevicePolicy | None:
    """A transport's ``policies`` setting (one policy, or device id -> policy) for one device."""
    if policies is None:
        return default
    if isinstance(policies, DevicePolicy):
        return policies
    return dict(policies).get(int(device_id), default)


def _secure_form(protocol: Any) -> Any:
    try:
        return protocol.secure_form()
    except Exception:  # a protocol without a secure form sums nothing securely
        return protocol


def _fingerprint(protocol: Any) -> str:
    """One fit's protocol (name and config): charged once per device state."""
    try:
        cfg = protocol.config()
    except Exception:
        cfg = {}
    text = json.dumps([getattr(protocol, "name", ""), cfg], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _private(protocol: Any) -> bool:
    privacy = getattr(protocol, "privacy", None)
    return privacy is not None and bool(getattr(privacy, "private", False))


def _check_rounds(protocol: Any, name: str, action: str, round_index: int, state: dict,
                  device: str) -> list[list]:
    """The (round, action) pairs this fit answered so far; refuses a repeated pair or a
    request past the rounds the protocol (built on the device from the public config)
    declares for ``action``."""
    raw = state.get(_ANSWERED + _fingerprint(protocol))
    answered = [] if raw is None else json.loads(np.asarray(raw, np.uint8).tobytes())
    if [round_index, action] in answered:
        raise PolicyRefusal(f"{device}: refuses a second {action!r} request for round "
                            f"{round_index} of private protocol {name!r}: it answered that "
                            "round already (a repeat is a release its ledger never charged)")
    declared = getattr(protocol, "declared_rounds", None)
    if declared is not None:
        allowed = int(declared().get(action, 0))
        done = sum(1 for _, a in answered if a == action)
        if done >= allowed:
            raise PolicyRefusal(f"{device}: refuses {action!r} request {done + 1} of private "
                                f"protocol {name!r}: the fit declares {allowed} {action!r} "
                                "round(s)")
    else:  # no declared rounds: at most one request per release the plan declares
        releases = getattr(getattr(protocol, "plan", None), "releases", None) or ()
        allowed = sum(max(int(r.repeats), 0) for r in releases)
        if len(answered) >= allowed:
            raise PolicyRefusal(f"{device}: refuses {action!r} request {len(answered) + 1} of "
                                f"private protocol {name!r}: its plan declares {allowed} "
                                "release(s)")
    return answered


def _events(protocol: Any, name: str, device: str) -> list[tuple[float, int]]:
    """(noise multiplier, repeats) of the releases the protocol declares."""
    privacy = getattr(protocol, "privacy", None)
    if privacy is None or not getattr(privacy, "private", False):
        raise PolicyRefusal(f"{device}: refuses protocol {name!r} without differential "
                            "privacy: its policy holds a privacy budget")
    plan = getattr(protocol, "plan", None)
    releases = getattr(plan, "releases", None)
    if not releases:
        raise PolicyRefusal(f"{device}: refuses protocol {name!r}: it declares no releases "
                            "the device can account")
    out = []
    for r in releases:
        z = float(r.noise_multiplier)
        if int(r.repeats) <= 0:
            continue
        if not (z > 0 and math.isfinite(z)):
            raise PolicyRefusal(f"{device}: refuses protocol {name!r}: release {r.what!r} "
                                "has no noise")
        out.append((z, int(r.repeats)))
    return out


class PrivacyLedger:
    """A device's own record of what it has released, with its budget.

    Entries are Gaussian mechanisms ``(noise multiplier, repeats)``; their
    composition is ``dp-accounting``'s (:func:`fedclust.privacy.composed_epsilon`).
    With ``path`` the ledger is a JSON file (no pickle), rewritten atomically
    (a temporary file in the same folder, then a rename) with mode 0600.
    """

    def __init__(self, epsilon: float, delta: float, path: str | None = None,
                 accountant: str = "pld"):
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.path = None if path is None else Path(path)
        self.accountant = accountant
        self.entries: list[dict[str, Any]] = []
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.entries = [{"what": str(e["what"]), "id": str(e["id"]),
                                 "events": [[float(z), int(n)] for z, n in e["events"]]}
                                for e in data["entries"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValidationError(f"privacy ledger {self.path}: cannot be read ({exc}); "
                                      "refusing to guess what was spent") from None

    def spent(self, extra: list[tuple[float, int]] = ()) -> float:
        """ε at ``delta`` of everything charged (and ``extra``)."""
        from .composition import composed_epsilon

        events = [tuple(ev) for e in self.entries for ev in e["events"]] + list(extra)
        if not events:
            return 0.0
        return composed_epsilon(events, self.delta, self.accountant)

    def charge(self, events: list[tuple[float, int]], what: str, device: str) -> float:
        """Add a fit's releases, or refuse it when the total would pass the budget."""
        total = self.spent(events)
        if total > self.epsilon * (1 + 1e-9):
            raise PolicyRefusal(f"{device}: refuses {what}: its privacy ledger would reach "
                                f"epsilon={total:.3g} at delta={self.delta:g}, past its budget "
                                f"{self.epsilon:g} (spent so far {self.spent():.3g})")
        self.entries.append({"what": what, "id": uuid.uuid4().hex,
                             "events": [[float(z), int(n)] for z, n in events]})
        self._save()
        return total

    def _save(self) -> None:
        if self.path is None:
            return
        body = json.dumps({"version": 1, "epsilon": self.epsilon, "delta": self.delta,
                           "entries": self.entries}, indent=1) + "\n"
        write_private_atomic(self.path, body.encode(), overwrite=True)


def write_private_atomic(path: str | Path, data: bytes, *, overwrite: bool,
                         mode: int = 0o600) -> Path:
    """Write ``data`` to ``path`` with ``mode`` from creation: a new temporary file
    (``O_CREAT | O_EXCL | O_NOFOLLOW``) in the same folder, then a rename over
    ``path`` (which replaces a symlink there, never follows it)."""
    path = Path(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise ValidationError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd_name = tempfile.mktemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(fd_name, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # the umask may have narrowed it: exactly ``mode``
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(fd_name, path)
    except BaseException:
        try:
            os.unlink(fd_name)
        except OSError:
            pass
        raise
    return path
