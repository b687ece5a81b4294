"""The keyed server's forget routines that work on every start at once, each against the
per-start path it stands for: the same bits."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.random import key_uniforms, key_uniforms_at
from fedclust.kfed import keyed_result, keyed_rows

from .keyed_helpers import (candidate_rows_agree, parts_agree_with_scratch,
                            seed_distances_agree)

K = 4


def _close_federation(rng, n_devices):
    """Devices of 10 to 24 points around two of K means drawn with standard deviation 2.5,
    close enough that forgets change labels and picks."""
    means = rng.normal(size=(K, 3)) * 2.5
    Xs = []
    for _ in range(n_devices):
        own = rng.choice(K, size=2, replace=False)
        n = int(rng.integers(10, 25))
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, 3)))
    return Xs


def test_key_uniforms_at_each_start_and_step_are_the_per_draw_uniforms():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, size=(3, 5, 7), dtype=np.uint64)
    starts = np.arange(3)[:, None, None]
    steps = np.array([0, 1, 2, 9, 30])[None, :, None]
    got = key_uniforms_at(keys, starts, steps)
    for s in range(3):
        for j, t in enumerate(steps.ravel()):
            assert np.array_equal(got[s, j], key_uniforms(keys[s, j], s, int(t)))


def _same_partition(a, b, k):
    """The reference: the map a -> b built label by label, a function and one-to-one."""
    to = {}
    for x, y in zip(a.tolist(), b.tolist()):
        if to.setdefault(x, y) != y:
            return False
    return len(set(to.values())) == len(to)


@pytest.mark.parametrize("n", [3, 40, 400])
def test_same_partitions_against_a_label_by_label_map(n):
    # small n with larger k takes the map; larger n the table of label pairs
    rng = np.random.default_rng(n)
    for _ in range(200):
        k = int(rng.integers(1, 12))
        a = rng.integers(0, k, n)
        B = []
        for _ in range(4):
            b = rng.permutation(k)[a]   # the same partition, other names
            kind = rng.integers(4)
            if kind == 1:   # one row moved
                b[rng.integers(n)] = rng.integers(k)
            elif kind == 2:   # two clusters merged
                b = np.where(b == b[0], b[-1], b)
            elif kind == 3:
                b = rng.integers(0, k, n)
            B.append(b)
        B = np.array(B, dtype=np.int16)
        got = keyed_result.same_partitions(a.astype(np.int16), B, k)
        assert got.tolist() == [_same_partition(a, b, k) for b in B]


def test_partition_classes_names_each_start_by_its_first_equal_partition():
    rng = np.random.default_rng(3)
    k, n = 3, 60
    base = rng.integers(0, k, n)
    other = rng.integers(0, k, n)
    finals = [base, rng.permutation(k)[other], rng.permutation(k)[base], other, base.copy()]
    alive = np.ones(n, bool)
    sizes = [0] * 5
    names = keyed_result.partition_classes(finals, sizes, alive, k, [None] * 5)[0]
    assert names == [0, 1, 0, 1, 0]
    # a removed row where two starts differ: they group the remaining rows alike
    finals[4] = finals[4].copy()
    finals[4][7] = (finals[4][7] + 1) % k
    alive[7] = False
    assert keyed_result.partition_classes(finals, sizes, alive, k, [None] * 5)[0][4] == 0
    # other cluster weights: never compared
    assert keyed_result.partition_classes(finals, [0, 0, 0, 0, 1], alive, k,
                                          [None] * 5)[0][4] == 4


@pytest.mark.parametrize("seed", range(6))
def test_partition_codes_after_changed_rows_name_starts_as_from_scratch(seed):
    # starts grouped at a "last forget" keep their names and codes; then a few rows change
    # value (a row deletion's new pieces) and take new labels in some starts: the names
    # from the codes and the changed rows are the names worked out from scratch, and each
    # start's code maps its labels to its class's labels row by row
    rng = np.random.default_rng(seed)
    k, n = 4, 80
    base = [rng.integers(0, k, n) for _ in range(2)]
    finals = [rng.permutation(k)[base[int(rng.integers(2))]] for _ in range(6)]
    alive = np.ones(n, bool)
    sizes = [0] * 6
    names, codes = keyed_result.partition_classes(finals, sizes, alive, k, [None] * 6)
    assert names == keyed_result.partition_classes(finals, sizes, alive, k, [None] * 6)[0]
    for _ in range(4):
        known = [(names[s], codes[s]) for s in range(6)]
        check = rng.choice(n, size=3, replace=False)
        alive[rng.integers(n)] = False
        alive[check] = True
        for s in range(6):
            if rng.random() < 0.5:   # some starts label the changed rows otherwise
                finals[s] = finals[s].copy()
                finals[s][check] = rng.integers(0, k, 3)
        names, codes = keyed_result.partition_classes(finals, sizes, alive, k, known, check)
        assert names == keyed_result.partition_classes(finals, sizes, alive, k, [None] * 6)[0]
        rows = np.flatnonzero(alive)
        for s in range(6):
            r = names[s]
            assert np.array_equal(codes[s][finals[s][rows]], codes[r][finals[r][rows]])


def _trace_and_entering(seed):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(K, 3)) * 6
    Xs = [means[rng.choice(K, 2, replace=False)[rng.integers(2, size=40)]]
          + rng.normal(size=(40, 3)) for _ in range(30)]
    model = KFed(K, random_state=seed).fit(Xs)
    tr = model._unlearning_.trace
    z = tr.ids[seed % len(tr.ids)]
    lo, hi = tr.offsets[tr.row_of[z]], tr.offsets[tr.row_of[z] + 1]
    n_new = max(1, hi - lo - 1)
    # new pieces near the old ones and a few far away: some labels change per iteration
    C = tr.C[lo:lo + n_new] + rng.normal(size=(n_new, 3)) * 4
    msg = SimpleNamespace(centers=C, counts=rng.integers(1, 9, n_new),
                          scatter=rng.random(n_new))
    e = keyed_rows.entering(tr, {z: msg})
    assert e is not None
    return tr, e


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_new_pieces_enter_every_run_at_once_as_run_by_run(seed):
    tr, e = _trace_and_entering(seed)
    k = tr.runs[0].cs.shape[1]
    R = e.old
    CR, wR = tr.C[R], tr.w[R]
    args = (R, CR * wR[:, None], wR, wR * (CR ** 2).sum(axis=1), k)
    runs_all = copy.deepcopy(dict(enumerate(tr.runs)))
    together, stats = keyed_rows.downdated(runs_all, *args)
    keyed_rows.enter_runs(together, e, k, stats)
    for s, run in enumerate(tr.runs):
        one, st = keyed_rows.downdated({s: copy.deepcopy(run)}, *args)
        keyed_rows.enter_runs(one, e, k, st)
        a, b = together[s], one[s]
        for x in ("S", "W", "Q", "A"):
            assert np.array_equal(getattr(a, x), getattr(b, x)), x
        assert all(np.array_equal(x, y) for x, y in zip(a.moved, b.moved))
        assert all(np.array_equal(x, y) for x, y in zip(a.stack, b.stack))
        # the new pieces' labels are the nearest of the fit's centers at every iteration
        D = ((e.C[None, :, None, :] - run.cs[:, None]) ** 2).sum(axis=3)
        assert np.array_equal(a.A[:, e.new], D.argmin(axis=2))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_every_run_s_centers_and_new_pieces_labels_at_once_as_run_by_run(seed, monkeypatch):
    from fedclust.kfed import keyed_unlearn
    from fedclust.kfed.keyed_trace import labels_or_tie

    tr, e = _trace_and_entering(seed)
    k = tr.runs[0].cs.shape[1]
    R = e.old
    CR, wR = tr.C[R], tr.w[R]
    runs, stats = keyed_rows.downdated(copy.deepcopy(dict(enumerate(tr.runs))), R,
                                       CR * wR[:, None], wR, wR * (CR ** 2).sum(axis=1), k)
    keyed_rows.enter_runs(runs, e, k, stats)
    keyed_rows.write(tr, e)   # the new pieces in their slots, as a forget writes them
    pre = keyed_rows.run_centers(runs, stats, e.C)
    alive = tr.alive.copy()
    alive[R] = False
    alive[e.new] = True
    monkeypatch.setattr(tr, "alive", alive)
    monkeypatch.setattr(tr, "extra", e.new)
    followed = 0
    for s, run in runs.items():
        c, lab, tie = pre[s]
        T = len(run.cs) - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            ref = np.concatenate([run.cs[:1], run.S[:T] / run.W[:T, :, None]])
        assert np.array_equal(c, ref)
        for t in range(T + 1):   # where no two centers tie, the labels of labels_or_tie
            want, near = labels_or_tie(e.C, c[t])
            assert np.array_equal(lab[t], want) or near or tie[t].any()
        # the follow of the run with these inputs and with its own: the same answer
        a = keyed_unlearn._follow(tr, run, 1.0, 1e-12, None, pre[s])
        b = keyed_unlearn._follow(tr, run, 1.0, 1e-12)
        assert (a is None) == (b is None)
        if a is not None:
            assert np.array_equal(a[0], b[0]) and a[2] == b[2] and a[4] == b[4]
            followed += 1
    assert followed   # some runs were followed with the new pieces in them


def _check(model, Xs, ids, gone):
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = KFed(K, random_state=5).fit([Xs[i] for i in keep],
                                        device_ids=[ids[i] for i in keep])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert model.device_ids_ == fresh.device_ids_
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        assert np.array_equal(a, b)
    assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings
    tr = model._unlearning_.trace
    if tr is None:
        return 0
    candidate_rows_agree(tr)
    seed_distances_agree(tr)
    return parts_agree_with_scratch(tr)


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_interleaved_row_deletions_whose_pieces_change_label_equal_a_fresh_fit(
        trial, monkeypatch):
    # overlapping groups and small devices: a new piece's label at the downdated centers
    # differs from its label at the fit's in some run (corrected iteration by iteration),
    # and some deletions change a pick; every state against a fresh fit
    from fedclust.kfed import keyed_unlearn

    relabelled = []
    real = keyed_unlearn._replay

    def spy(tr, *a):
        out = real(tr, *a)
        if tr.extra is not None:
            relabelled.append(int(np.isin(out[1][0], tr.extra).sum()))
        return out

    monkeypatch.setattr(keyed_unlearn, "_replay", spy)
    rng = np.random.default_rng(700 + trial)
    Xs = _close_federation(rng, 60)
    ids = list(range(60))
    model = KFed(K, random_state=5).fit(Xs, device_ids=ids)
    gone: list[int] = []
    reruns = named = 0
    for step in range(10):
        left = [z for z in ids if z not in gone]
        z = left[int(rng.integers(len(left)))]
        i = ids.index(z)
        if step % 4 == 3:
            model.forget(devices=[z])
            gone.append(z)
        else:
            rows = rng.choice(len(Xs[i]), size=int(rng.integers(1, 6)), replace=False)
            model.forget(rows={z: rows.tolist()}, relabel=False)
            Xs[i] = np.delete(Xs[i], rows, axis=0)
            if model.forget_log_[-1].path == "trace":
                reruns += len(model._unlearning_.trace.reruns)
        named += _check(model, Xs, ids, gone)
    assert sum(relabelled) >= 1 and reruns >= 1 and named >= 1


@pytest.mark.slow
@pytest.mark.parametrize("trial", [0, 1])
def test_long_interleaved_sequences_keep_every_kept_structure_as_from_scratch(trial):
    # 30 forgets, a device every fifth: every state against a fresh fit, and the trace's
    # kept partition codes, candidate rows and seed distances against their recomputation
    rng = np.random.default_rng(900 + trial)
    Xs = _close_federation(rng, 70)
    ids = list(range(70))
    model = KFed(K, random_state=5).fit(Xs, device_ids=ids)
    gone: list[int] = []
    reruns = entered = named = 0
    for step in range(30):
        left = [z for z in ids if z not in gone]
        z = left[int(rng.integers(len(left)))]
        i = ids.index(z)
        if step % 5 == 4:
            model.forget(devices=[z], relabel=False)
            gone.append(z)
        else:
            rows = rng.choice(len(Xs[i]), size=int(rng.integers(1, 6)), replace=False)
            model.forget(rows={z: rows.tolist()}, relabel=False)
            Xs[i] = np.delete(Xs[i], rows, axis=0)
        tr = model._unlearning_.trace
        if model.forget_log_[-1].path == "trace":
            reruns += len(tr.reruns)
            entered += len(tr.entered or [])
        named += _check(model, Xs, ids, gone)
    assert reruns >= 1 and entered >= 1 and named >= 1
