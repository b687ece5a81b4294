"""Compiled fast path of the per-sample loop (numba; pure-numpy fallback).

:func:`scan_full` streams rows while each is simply absorbed by its best
cluster (O(c D^2): Mahalanobis distances, a rank-one update of the mean and
scatter, Sherman–Morrison on the precision, determinant lemma on log det) and
hands control back to Python for the rare events: a new cluster, a Cholesky
refresh, or (``report_active``: the paper's online merges) a merge check when other
clusters are also active for the sample.
``lab[i]`` receives the uid of the cluster that absorbed row i.
The arithmetic is the same as :meth:`ClusterSet.learn`'s numpy path (tested).
numba is a dependency; if it fails to import, ``HAVE_NUMBA`` is False and the numpy
path runs (4-12x slower).
"""

from __future__ import annotations

import numpy as np

try:  # pragma: no cover - exercised when numba is installed
    from numba import njit

    HAVE_NUMBA = True
except Exception:  # pragma: no cover - numba missing or broken: the numpy loop runs
    HAVE_NUMBA = False

    def njit(*args, **kw):  # type: ignore[no-redef]
        def wrap(f):
            return f
        return wrap if not (args and callable(args[0])) else args[0]

__all__ = ["HAVE_NUMBA", "scan_full", "NEW", "EVENT", "DONE"]

DONE, NEW, EVENT = 0, 1, 2


@njit(cache=True)
def scan_full(X, y, i0, t, mu, S, P, ld, n, cls, last, upd, C, gate, n0, refresh_every,
              act, report_active, uid, lab):  # pragma: no cover - compiled
    N, D = X.shape
    d2 = np.empty(C)
    diff = np.empty(D)
    Pe = np.empty(D)
    for i in range(i0, N):
        c = y[i]
        best = -1
        bestd = np.inf
        for k in range(C):
            if c >= 0 and cls[k] != c:
                d2[k] = np.inf
                continue
            s = 0.0
            for a in range(D):
                diff[a] = X[i, a] - mu[k, a]
            for a in range(D):
                acc = 0.0
                for b in range(D):
                    acc += P[k, a, b] * diff[b]
                s += acc * diff[a]
            d2[k] = s
            if s < bestd:
                bestd = s
                best = k
        if best < 0 or not bestd <= gate:
            return i, best, NEW, t, 0
        t += 1
        j = best
        lab[i] = uid[j]
        for a in range(D):
            diff[a] = X[i, a] - mu[j, a]
        for a in range(D):
            acc = 0.0
            for b in range(D):
                acc += P[j, a, b] * diff[b]
            Pe[a] = acc
        nj = n[j]
        m = nj + n0 - 1.0
        f = nj / (nj + 1.0)
        for a in range(D):
            mu[j, a] += diff[a] / (nj + 1.0)
        for a in range(D):
            for b in range(D):
                S[j, a, b] += f * diff[a] * diff[b]
        n[j] = nj + 1.0
        last[j] = t
        upd[j] += 1
        if upd[j] < refresh_every:
            al = m / (m + 1.0)
            r = f / m
            den = 1.0 + r * d2[j]
            w = r / den
            for a in range(D):
                for b in range(D):
                    P[j, a, b] = (P[j, a, b] - w * Pe[a] * Pe[b]) / al
            ld[j] += D * np.log(al) + np.log(den)
        na = 0
        if report_active:
            for k in range(C):
                if k != j and d2[k] <= gate:
                    act[na] = k
                    na += 1
        if na > 0 or upd[j] >= refresh_every:
            return i, j, EVENT, t, na
    return N, -1, DONE, t, 0
