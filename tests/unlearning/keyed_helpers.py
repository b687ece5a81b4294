"""What the keyed-server forget tests share: a federation of overlapping groups, the model,
and the comparison of a model after forgets with a fresh fit on what remains."""

from __future__ import annotations

import numpy as np

from fedclust import KFed
from fedclust.kfed import keyed, keyed_trace
from fedclust.kfed.explain import center_split
from fedclust.unlearning.forget import results_close


K = 4


def federation(rng, n_devices, d=3):
    means = rng.normal(size=(K, d)) * 6
    Xs = []
    for _ in range(n_devices):
        n = int(rng.integers(25, 45))
        own = rng.choice(K, size=2, replace=False)
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, d)))
    return Xs


def make_keyed():
    return KFed(K, 2, server="weighted-kmeans++-keyed", random_state=7)


def check_fresh(model, Xs, ids, gone, make=None):
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = (make or make_keyed)().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
    # bit for bit after the step in full and after following the trace alike
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert model.device_ids_ == fresh.device_ids_
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        assert np.array_equal(a, b)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        assert np.array_equal(a, b)
    assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
    assert results_close(model._unlearning_.result, fresh._unlearning_.result)
    assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings


def splits_are_the_remaining_rows(tr):
    """The warning's kept per-center splits are those of the remaining rows, bit for bit
    (nothing of a forgotten row stays in them)."""
    from fedclust.kfed.explain import split_bound

    ex = tr.expl
    assert np.array_equal(ex.alive, tr.alive)
    for j, got in enumerate(ex.bounds):   # kept bounds: those of the remaining rows
        if got is not keyed_trace.STALE:
            rows = np.flatnonzero(ex.alive & (ex.labels == j))
            assert got == split_bound(tr.C[rows], tr.w[rows])
    for j, got in enumerate(ex.splits):
        if got is keyed_trace.STALE:   # not worked out since its rows changed
            continue
        rows = np.flatnonzero(ex.alive & (ex.labels == j))
        if not len(rows):
            assert got is None
            continue
        want = center_split(tr.C[rows], tr.w[rows], tr.scatter[rows])
        for f in ("n", "cost", "gain", "along"):
            assert getattr(got, f) == getattr(want, f)
        for f in ("mean", "halves", "half_means"):
            assert np.array_equal(getattr(got, f), getattr(want, f))


def seed_holders(trace):
    return {trace.seed_device, *trace.ff_owners.tolist(),
            *trace.owner[trace.seeds.ravel()].tolist()}


def fewest_starts_to_rerun(trace, ids):
    """A device holding no first seed and the fewest k-means++ seeds: the fewest starts to
    run again when it leaves."""
    held = trace.owner[trace.seeds.ravel()].tolist()
    return min((z for z in ids if z != trace.seed_device and z not in trace.ff_owners),
               key=held.count)


def parts_agree_with_scratch(tr):
    """Each start's kept partition name and code (``KeyedTrace.parts``) against the starts'
    partitions of the remaining rows worked out from scratch: starts of one name group the
    rows alike, their codes map their labels to the same labels row by row, and starts of
    two names group them otherwise."""
    from fedclust.kfed.keyed_result import same_partitions

    alive = np.flatnonzero(tr.alive)
    k = tr.runs[0].cs.shape[1]
    known = [(s, p) for s, p in enumerate(tr.parts or []) if p is not None]
    for s, (t, name, code) in known:
        lab = tr.runs[s].A[t][alive].astype(np.int64)
        assert (code[lab] >= 0).all()
        for r, (t2, name2, code2) in known:
            lab2 = tr.runs[r].A[t2][alive].astype(np.int64)
            same = bool(same_partitions(lab, lab2[None, :], k)[0])
            if name2 == name:
                assert same and np.array_equal(code[lab], code2[lab2])
            else:
                assert not same
    return len(known)


def candidate_rows_agree(tr):
    """The trace's kept candidate rows (gathered once, then refreshed slot by slot) against
    a gather of every slot from scratch, bit for bit, before and after they are brought
    up to the trace's current candidates."""
    from fedclust.kfed.keyed_seeding import candidate_rows

    if tr.cand_rows is not None:
        slots, Y, y_sq = tr.cand_rows
        assert np.array_equal(Y, tr.C[slots.ravel()])
        assert np.array_equal(y_sq, tr.c_sq[slots.ravel()])
    cand = np.where(tr.cand >= 0, tr.cand, 0)
    Y, y_sq = candidate_rows(tr, cand)
    assert np.array_equal(Y, tr.C[cand.ravel()]) and np.array_equal(y_sq, tr.c_sq[cand.ravel()])


def seed_distances_agree(tr):
    """Each run's kept ``d0`` (a row's squared distance to the seed it is labelled with at
    the run's first assignment) against that distance measured from scratch, for every
    remaining row, within rounding: ``piece_potentials`` bounds with it."""
    rows = np.flatnonzero(tr.alive)
    for run in tr.runs:
        if run.d0 is None:
            continue
        seed = run.cs[0][run.A[0][rows].astype(np.int64)]
        want = ((tr.C[rows] - seed) ** 2).sum(axis=1)
        np.testing.assert_allclose(run.d0[rows], want, rtol=1e-9, atol=1e-9 * tr.scale2)
        assert not run.d0[~tr.alive].any()
