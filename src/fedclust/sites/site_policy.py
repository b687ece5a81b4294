"""A deployed site run as the device's own policy checks it (:class:`SitePolicyView`).

The site run (:class:`~fedclust.sites.deployed.SitePreprocessProtocol`) is one fit made
of three protocols: the schema round, the preprocessing round and the algorithm's
rounds. The algorithm's protocol exists on a site only once the schema has arrived, so
the policy sees the run through this view, rebuilt from the site's own state at each
request: the whole fit's differential privacy, its releases (the preprocessing's and
the algorithm's, charged to the device's ledger together, once) and the rounds each
action may be asked.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

__all__ = ["SitePolicyView"]


class SitePolicyView:
    """What :class:`~fedclust.core.policy.DevicePolicy` checks of a site run on one site.

    Parameters
    ----------
    name : str
        The site protocol's registered name (what a policy's allowlist names).
    config : dict
        The site protocol's config: the fit's fingerprint for the ledger and the
        round counts, the same before and after the schema round.
    experiment : dict
        The run's public settings; ``experiment["privacy"]`` is the fit's privacy.
    own_actions : sequence of str
        The site protocol's own one-round actions (schema up, schema down, store).
    parts : sequence of Protocol
        The preprocessing's and the algorithm's protocols as this site built them from
        the schema it stored; empty before the schema round reached the site.
    summed_actions : frozenset of str
        Actions whose replies the server only sums.

    Notes
    -----
    Before the schema arrives the site answers only the schema round, which releases no
    row (under privacy its category and label sets are the public ones and its row
    count is sent as 1), so nothing is charged yet (``releases_pending``); the first
    request after it charges the preprocessing's and the algorithm's releases at once.
    A server that sends the site an algorithm config with less noise gets that config
    charged as it is, so the device's own budget still bounds what it releases.
    """

    def __init__(self, name: str, config: Mapping[str, Any], experiment: Mapping[str, Any],
                 own_actions: Sequence[str], parts: Sequence[Any],
                 summed_actions: frozenset = frozenset()):
        from ..privacy import DifferentialPrivacy

        self.name = str(name)
        self._config = dict(config)
        self._own = [str(a) for a in own_actions]
        self._parts = list(parts)
        self.summed_actions = frozenset(summed_actions)
        privacy = (DifferentialPrivacy.from_config(experiment["privacy"])
                   if experiment.get("privacy") else None)
        for p in self._parts:  # a seed in any part is a seed the server chose
            own = getattr(p, "privacy", None)
            if own is not None and getattr(own, "noise_seed", None) is not None:
                privacy = own
        self.privacy = privacy
        self.releases_pending = not self._parts
        releases = [r for p in self._parts
                    for r in (getattr(getattr(p, "plan", None), "releases", None) or ())]
        self.plan = SimpleNamespace(releases=releases) if releases else None

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def secure_form(self) -> "SitePolicyView":
        return self

    def declared_rounds(self) -> dict[str, int]:
        """Each action's rounds: one for the site protocol's own, and what the
        preprocessing's and the algorithm's protocols declare (a part that declares none
        may be asked each of its actions as often as it declares releases)."""
        rounds = {a: 1 for a in self._own}
        for p in self._parts:
            declared = getattr(p, "declared_rounds", None)
            if declared is not None:
                part = {str(a): int(n) for a, n in declared().items()}
            else:
                releases = getattr(getattr(p, "plan", None), "releases", None) or ()
                n = sum(max(int(r.repeats), 0) for r in releases)
                part = {str(a): n for a in getattr(p, "reply_types", {})}
            for a, n in part.items():
                rounds[a] = rounds.get(a, 0) + n
        return rounds


def site_view(site: Any, parts: Sequence[Any], own_actions: Sequence[str]) -> SitePolicyView:
    """The view of ``site`` (a :class:`~fedclust.sites.deployed.SitePreprocessProtocol`)."""
    return SitePolicyView(site.name, site.config(), json.loads(site.experiment), own_actions,
                          parts, site.summed_actions)
