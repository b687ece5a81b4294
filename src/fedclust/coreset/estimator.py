"""scikit-learn-style front doors: :class:`DistributedPCA` and :class:`DistributedKMeans`.

``graph=None`` (or ``"star"``) is the federated case: a coordinator, and the
:class:`~fedclust.coreset.protocol.CoresetProtocol` runs on any transport
(in-process or Flower). Any other graph — a networkx graph, a symmetric
adjacency matrix, or a topology name — is simulated in process by flooding
(:mod:`fedclust.coreset.graph`); Flower has a server, so it runs only stars.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import networkx as nx
from sklearn.base import (BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin,
                          TransformerMixin)

from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.estimators import CenterEstimatorMixin, split_federation
from ..core.validation import (check_array, check_choice, check_device_ids, check_devices,
                               check_flags, check_int, check_n_features)
from ..sim.transport import InProcessTransport
from ..unlearning.forget import ForgetMixin, run_recorded
from .graph import TOPOLOGIES, check_graph, make_graph, run_on_graph
from .messages import WORD_BYTES
from .protocol import METHODS, CoresetProtocol
from ..privacy import refuse_privacy

__all__ = ["DistributedPCA", "DistributedKMeans"]


def _is_star(graph: Any) -> bool:
    return graph is None or (isinstance(graph, str) and graph == "star")


def _federation(devices: Any) -> list[np.ndarray]:
    devices = check_devices(devices, min_points=0)
    if all(len(X) == 0 for X in devices):
        raise ValidationError(f"all {len(devices)} devices are empty: nothing to fit")
    return devices


def _run(protocol: CoresetProtocol, devices: list[np.ndarray], ids: list[int], graph: Any,
         graph_p: float, graph_m: int, seed: int, transport: Transport | None, progress: bool,
         recorder: Any = None):
    """Run on the star (a transport) or on a graph (flooding). Returns (output, comm, graph).

    Graph node j (0..n-1, as given or generated) is the device at position j. On the
    star, ``recorder`` (an estimator) keeps the server's summaries for ``forget``.
    """
    if _is_star(graph):
        transport = transport or InProcessTransport(progress=progress)
        if recorder is not None:
            out = run_recorded(recorder, transport, protocol, dict(zip(ids, devices)), seed)
        else:
            out = transport.run(protocol, dict(zip(ids, devices)), seed)
        comm = out.meter.summary()
        comm.update(topology="star", words_up=comm["bytes_up"] // WORD_BYTES,
                    words_down=comm["bytes_down"] // WORD_BYTES,
                    words_total=comm["bytes_total"] // WORD_BYTES)
        return out, comm, None
    if transport is not None and not getattr(transport, "runs_graphs", False):
        raise ValidationError(
            f"a general graph needs a transport that relays between neighbours (the Flower "
            f"transports do); {type(transport).__name__} runs only a star: pass graph=None / "
            "'star', or no transport to flood in process")
    if isinstance(graph, str):
        check_choice(graph, "graph", TOPOLOGIES)
        g = make_graph(graph, len(devices), p=graph_p, m=graph_m, random_state=seed)
    else:
        g = check_graph(graph, len(devices))
    g = nx.relabel_nodes(g, dict(enumerate(ids)))
    if transport is not None:  # Flower: the server only relays along g's edges
        out = transport.run(protocol, dict(zip(ids, devices)), seed, graph=g)
        return out, out.meter.summary(), g
    run = run_on_graph(protocol, dict(zip(ids, devices)), g, seed)
    return run, run.summary(), g


class DistributedPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Distributed PCA (disPCA; Liang, Balcan, Kanchanapally & Woodruff, NIPS 2014, Alg. 1).

    Optional global centring (one round of sums and counts), then every node
    sends the top ``local_components`` singular values and right singular
    vectors of its centred data; the coordinator takes the top
    ``n_components`` eigenvectors of Σ_i E_i D_i² E_iᵀ, sorted by decreasing
    eigenvalue, and broadcasts them.

    Parameters
    ----------
    n_components : int
        t, the dimension kept (>= 1). ``n_components >= d`` keeps all d
        directions: the projection ``VᵀV`` is then the identity (lossless).
    local_components : int or None
        t₁ each node sends (default ``n_components``). ``t₁ >= rank(P_i)``
        for every node makes the result exact (equal to centralized PCA).
    center : bool, default=True
        Centre with the global mean first.
    graph, graph_p, graph_m
        As in :class:`DistributedKMeans`.
    random_state : int, Generator or None
        Seeds the randomized SVDs (per node, keyed by node id).

    Attributes
    ----------
    components_ : ndarray (t, d), rows sorted by decreasing variance
    mean_ : ndarray (d,) (zeros when ``center=False``)
    singular_values_, explained_variance_ : ndarray (t,)
        ``explained_variance_ = singular_values_² / (N − 1)``, as scikit-learn.
    n_components_ : int
    communication_ : dict
        Bytes and words (8-byte numbers): node i sends ``8 (d + 1)`` (centring)
        + ``8 t₁ (d + 1)``; the star broadcasts ``8 d`` (mean) per node.

    Notes
    -----
    Node work: one (randomized) SVD, O(n_i d t₁); coordinator:
    O((Σ t₁)² d). Communication is independent of n.
    """

    def __init__(self, n_components: int = 10, *, local_components: int | None = None,
                 center: bool = True, graph: Any = None, graph_p: float = 0.3,
                 graph_m: int = 2, random_state: RandomState = None, progress: bool = False):
        self.n_components = n_components
        self.local_components = local_components
        self.center = center
        self.graph = graph
        self.graph_p = graph_p
        self.graph_m = graph_m
        self.random_state = random_state
        self.progress = progress

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "DistributedPCA":
        """Fit on a federation of (n_i, d) arrays (empty nodes allowed); ``X``, ``groups``
        and ``transport`` as in :meth:`fedclust.KFed.fit`.

        ``device_ids`` names the nodes (default 0..n-1); random streams follow
        the ids, so permuting devices with their ids changes nothing.
        """
        check_flags(self, "center", "progress")
        fed = split_federation(X, groups=groups, device_ids=device_ids)
        t = check_int(self.n_components, "n_components", min_value=1)
        devices = _federation(fed.devices)
        ids = check_device_ids(fed.device_ids, len(devices))
        d = devices[0].shape[1]
        t = min(t, d)
        t1 = t if self.local_components is None else check_int(
            self.local_components, "local_components", min_value=1)
        protocol = CoresetProtocol(1, 1, n_components=t, local_components=min(t1, d),
                                   center=self.center, n_features=d, pca_only=True)
        self.seed_ = root_seed(self.random_state)
        out, self.communication_, self.graph_ = _run(
            protocol, devices, ids, self.graph, self.graph_p, self.graph_m, self.seed_,
            transport, self.progress)
        res = out.result
        self.components_ = res.components
        self.n_components_ = res.components.shape[0]
        self.mean_ = res.mean if res.mean.size else np.zeros(d)
        self.singular_values_ = res.singular_values
        self.n_samples_ = res.n_points
        self.explained_variance_ = res.singular_values ** 2 / max(res.n_points - 1, 1)
        self.n_features_in_ = d
        self.run_log_ = out.log
        return self

    @property
    def _n_features_out(self) -> int:
        """Output width for ``get_feature_names_out`` (distributedpca0, ...)."""
        return self.n_components_

    def _check(self, X: Any, width: int, name: str) -> np.ndarray:
        if not hasattr(self, "components_"):
            raise NotFittedError("this DistributedPCA instance is not fitted yet; call fit first")
        return check_n_features(check_array(X, name), self, width, name)

    def transform(self, X: Any) -> np.ndarray:
        """Project (n, d) -> (n, t): ``(X − mean_) components_ᵀ``."""
        X = self._check(X, self.n_features_in_, "X")
        return (X - self.mean_) @ self.components_.T

    def inverse_transform(self, Z: Any) -> np.ndarray:
        """Back to the original space (n, t) -> (n, d): ``Z components_ + mean_``."""
        Z = self._check(Z, self.n_components_, "Z")
        return Z @ self.components_ + self.mean_


class DistributedKMeans(ForgetMixin, CenterEstimatorMixin, ClusterMixin, BaseEstimator):
    """Distributed k-means by a distributed coreset, optionally after distributed PCA.

    ``method="coreset"``: Balcan, Ehrlich & Liang (NIPS 2013), Algorithm 1 —
    every node finds a local solution B_i (k-means++ + Lloyd) and sends its
    cost c_i; it then samples t_i = ⌈t c_i / Σ c_j⌉ points with probability ∝
    cost, weight Σc_j / (t m_q), and adds its centers with weight
    ``|P_b| − Σ w_q``. ``method="combine"``: the COMBINE baseline (each node an
    independent coreset of size ⌈t / n⌉). The union is solved by weighted
    k-means (k-means++, ``n_init`` inits, Lloyd) with one seed, so every node
    that solves gets the same centers. With ``n_components`` the data are
    first projected by :class:`DistributedPCA` (Liang et al., NIPS 2014); the
    centers are lifted back to the original space.

    Parameters
    ----------
    n_clusters : int
    coreset_size : int
        t, the target coreset size (>= n_clusters). Σ t_i may exceed it by
        up to the number of nodes (rounding up), plus up to k centers per node.
    n_components : int or None
        None: no PCA. ``n_components >= d`` also skips PCA (identity).
    local_components : int or None
        disPCA's t₁ (default ``n_components``).
    center : bool, default=True
        Global centring before PCA.
    graph : None, "star", "complete", "gnp", "grid", "preferential", networkx graph or adjacency
        None / "star": a coordinator (runs on any transport). Otherwise the
        nodes flood messages to neighbours (in process; bytes per edge).
    graph_p, graph_m : float, int
        G(n, p)'s p and preferential attachment's m for named topologies.
    method : {"coreset", "combine"}
    n_init : int, default=5
        k-means++ inits of the coreset solve.
    local_max_iter, max_iter : int
        Lloyd rounds of the local solutions and of the coreset solve.
    privacy : None
        Refused with a one-line error: no differentially private version yet
        (see ``docs/privacy.md``).
    random_state : int, Generator or None

    Attributes
    ----------
    cluster_centers_ : ndarray (k, d), in the original space
    labels_ : ndarray (n,)
        Every point's cluster (device order, or the row order of X with ``groups``).
    device_labels_ : list of ndarray (n_i,) or None (a node that did not take part)
    coreset_ : tuple (points (s, t'), weights (s,))
        Signed weights; they add up to the number of points. t' = n_components or d.
    coreset_owner_ : ndarray (s,), node id of each coreset row
    components_, mean_ : the disPCA projection (None without PCA)
    communication_ : dict
        Star: ``bytes_up/down/total``, ``words_*`` (8-byte numbers),
        ``per_device``, ``rounds``. Graph: ``bytes_total``, ``words_total``,
        ``per_edge``, ``per_node`` (sent/received), ``max_crossings_per_message``.
    coreset_digests_ : dict node -> SHA-256 of the coreset that node assembled (graph runs)
    graph_ : networkx.Graph or None
    run_log_ : RunLog

    Notes
    -----
    Star bytes up per node: ``8 (d+1)`` (centring) + ``8 t₁ (d+1)`` (disPCA)
    + 16 (cost) + ``8 s_i (t'+1) + 8`` (coreset portion); down: ``8 d`` +
    ``8 t d`` + 32 + ``8 k d`` (final centers). On a graph every message is
    flooded: it crosses each edge once or twice. Node work O(n_i d t₁ + n_i k t);
    solve O(n_init · iterations · s k t'). Communication is independent of n.
    """

    def __init__(self, n_clusters: int = 8, coreset_size: int = 1000, *,
                 n_components: int | None = None, local_components: int | None = None,
                 center: bool = True, graph: Any = None, graph_p: float = 0.3,
                 graph_m: int = 2, method: str = "coreset", n_init: int = 5,
                 local_max_iter: int = 20, max_iter: int = 300, privacy: Any = None,
                 random_state: RandomState = None, progress: bool = False):
        self.n_clusters = n_clusters
        self.coreset_size = coreset_size
        self.privacy = privacy
        self.n_components = n_components
        self.local_components = local_components
        self.center = center
        self.graph = graph
        self.graph_p = graph_p
        self.graph_m = graph_m
        self.method = method
        self.n_init = n_init
        self.local_max_iter = local_max_iter
        self.max_iter = max_iter
        self.random_state = random_state
        self.progress = progress

    def _protocol(self, d: int) -> CoresetProtocol:
        k = check_int(self.n_clusters, "n_clusters", min_value=1)
        t = check_int(self.coreset_size, "coreset_size", min_value=1)
        if t < k:
            raise ValidationError(f"coreset_size={t} must be >= n_clusters={k}")
        n_comp = self.n_components
        if n_comp is not None:
            n_comp = check_int(n_comp, "n_components", min_value=1)
            if n_comp >= d:  # the identity projection: PCA would change nothing
                n_comp = None
        local = self.local_components
        if local is not None:
            local = min(check_int(local, "local_components", min_value=1), d)
        check_choice(self.method, "method", METHODS)
        return CoresetProtocol(k, t, n_components=n_comp, local_components=local,
                               center=self.center, method=self.method, n_init=self.n_init,
                               local_max_iter=self.local_max_iter, max_iter=self.max_iter,
                               n_features=d)

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "DistributedKMeans":
        """Fit on a federation of (n_i, d) arrays (empty nodes allowed); ``X``, ``groups``
        and ``transport`` as in :meth:`fedclust.KFed.fit`.

        ``device_ids`` names the nodes (default 0..n-1); random streams follow
        the ids and the coreset is assembled in id order, so permuting devices
        together with their ids leaves the result unchanged.
        """
        refuse_privacy(self.privacy, "DistributedKMeans",
                       "the local disPCA bases and the sampled coreset points are released "
                       "without noise; DistributedLloyd has DP")
        check_flags(self, "center", "progress")
        fed = split_federation(X, groups=groups, device_ids=device_ids)
        devices = _federation(fed.devices)
        ids = check_device_ids(fed.device_ids, len(devices))
        d = devices[0].shape[1]
        protocol = self._protocol(d)
        n_total = sum(len(X) for X in devices)
        if n_total < protocol.n_clusters:
            raise ValidationError(
                f"the federation has {n_total} points for n_clusters={protocol.n_clusters}")
        if not _is_star(self.graph) and isinstance(self.graph, str):
            check_choice(self.graph, "graph", TOPOLOGIES)
        self.seed_ = root_seed(self.random_state)
        out, self.communication_, self.graph_ = _run(
            protocol, devices, ids, self.graph, self.graph_p, self.graph_m, self.seed_,
            transport, self.progress, recorder=self)
        self._protocol_ = protocol
        self._store(out, ids)
        self._rows = fed.rows
        return self

    def _store(self, out: Any, ids: Sequence[int]) -> None:
        res = out.result
        d = res.centers.shape[1]
        self.device_ids_ = list(ids)
        self.cluster_centers_ = res.centers
        self.n_features_in_ = d
        self.coreset_ = (res.coreset_points, res.coreset_weights)
        self.coreset_owner_ = res.coreset_owner
        self.solver_cost_ = res.solver_cost
        pca = self._protocol_.uses_pca
        self.components_ = res.components if pca else None
        self.mean_ = (res.mean if res.mean.size else np.zeros(d)) if pca else None
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels") for z in ids]
        self.coreset_digests_ = getattr(out, "coreset_digests", {})
        self.run_log_ = out.log

    def _apply_forget(self, out: Any, device_ids: Sequence[int]) -> None:
        """The model after :meth:`forget` (``fedclust.unlearning``): as ``fit`` stores it."""
        self._store(out, device_ids)

