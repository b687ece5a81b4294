"""Exact statistics of Gaussian components made of whole pieces (count, mean, scatter).

A piece's log-likelihood under any Gaussian needs only its count, mean and scatter, so
the server can score, pool and rewrite components from the statistics of the pieces it
merged: the shared arithmetic of :mod:`fedclust.gauss.consolidate` and
:mod:`fedclust.gauss.regroup`.
"""

from __future__ import annotations

import numpy as np

from .model import ARRAYS, ClusterSet

__all__ = ["pool_pieces", "ridged_params", "piece_loglik", "own_loglik", "tied_loglik",
           "tied_from_loglik", "diagonals", "write_back"]


def pool_pieces(Z: np.ndarray, n: np.ndarray, mu: np.ndarray, T: np.ndarray, full: bool):
    """(n, mean, scatter) of the components whose pieces are the columns of one-hot Z
    (m, K); T are the pieces' second moments about the origin (centred data)."""
    nk = Z.T @ n
    with np.errstate(invalid="ignore", divide="ignore"):
        mk = (Z.T @ (n[:, None] * mu)) / nk[:, None]
    Tk = np.tensordot(Z.T, T, axes=1)
    if full:
        Sk = Tk - nk[:, None, None] * mk[:, :, None] * mk[:, None, :]
    else:
        Sk = Tk - nk[:, None] * mk ** 2
    return nk, mk, Sk


def ridged_params(nk, Sk, ridge, full):
    """Precisions and log-determinants of the ridged ML covariances (S + ridge) / n."""
    if full:
        A = (Sk + np.diag(ridge)) / nk[:, None, None]
        L = np.linalg.cholesky(A)
        ld = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        return np.linalg.inv(A), ld
    A = (Sk + ridge) / nk[:, None]
    return 1.0 / A, np.log(A).sum(axis=1)


def piece_loglik(n, mu, S, nk, mk, P, ld, N, full):
    """(m, K) log-likelihood of every piece's rows under every component, weights
    included (additive constants dropped)."""
    diff = mu[:, None, :] - mk[None]
    if full:
        tr = np.einsum("ide,kde->ik", S, P, optimize=True)
        q = np.einsum("ikd,kde,ike->ik", diff, P, diff, optimize=True)
    else:
        tr = S @ P.T
        q = np.einsum("ikd,kd->ik", diff ** 2, P)
    with np.errstate(divide="ignore"):
        logw = np.log(nk / N)
    return n[:, None] * (logw - 0.5 * ld)[None] - 0.5 * (tr + n[:, None] * q)


def own_loglik(nk, Sk, P, ld, N, full):
    """Log-likelihood of each component's rows under its own Gaussian and weight."""
    tr = np.einsum("kde,ked->k", Sk, P) if full else (Sk * P).sum(axis=1)
    return nk * (np.log(nk / N) - 0.5 * ld) - 0.5 * tr


def tied_loglik(n, mu, S, nk, mk, Sk, ridge, N, full) -> np.ndarray:
    """(m,) lower bound on the log-likelihood of every piece's rows under the mixture of
    the components (nk, mk, Sk) with weights nk / N and covariances (Sk + ridge) / nk,
    from the pieces' (n, mu, S) alone: n_i log sum_k exp(l_ik / n_i), with l_ik the
    log-likelihood of the piece's rows under component k and its weight; the
    responsibilities are shared by a piece's rows (equal to the mixture log-likelihood
    for one-row pieces). Additive constant -n_i D log(2 pi) / 2 dropped."""
    P, ld = ridged_params(nk, Sk, ridge, full)
    return tied_from_loglik(n, piece_loglik(n, mu, S, nk, mk, P, ld, N, full))


def tied_from_loglik(n, loglik) -> np.ndarray:
    """:func:`tied_loglik` from the (m, K) :func:`piece_loglik` of the pieces (a caller
    that scores several mixtures sharing components computes their columns once)."""
    a = loglik / n[:, None]
    top = a.max(axis=1)
    return n * (top + np.log(np.exp(a - top[:, None]).sum(axis=1)))


def diagonals(S):
    """The diagonals of (m, D, D) scatters (diagonal scatters unchanged)."""
    return np.diagonal(S, axis1=1, axis2=2) if S.ndim == 3 else S


def write_back(cs: ClusterSet, live: np.ndarray, nk, mk, Sk, z) -> None:
    """Components ``live`` (indices into the current slots) with their new statistics
    become the cluster set; a dissolved component's uid maps to where most of it went."""
    gone = np.setdiff1d(np.arange(cs.C), live)
    for g in gone:  # its pieces went to several components: no single heir
        cs.joined[int(cs.uid[g])] = -1
    for name in ARRAYS:
        arr = getattr(cs, name)
        arr[:live.size] = arr[live]
    cs.C = int(live.size)
    cs.n[:cs.C], cs.mu[:cs.C], cs.S[:cs.C] = nk[live], mk[live], Sk[live]
    cs.refresh(np.arange(cs.C))
