"""Byzantine devices in the simulator: liars on the wire (tamper hook) and poisoned data."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedclust import KFed, ValidationError
from fedclust.datasets import make_federated_gaussians
from fedclust.kfed.messages import LocalCenters
from fedclust.robust import TrimmedKMeans
from fedclust.sim.byzantine import ATTACKS, ByzantineTamper, choose_byzantine, poison_devices
from fedclust.sim.transport import InProcessTransport


def _msg(seed=0, k=3, d=5, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return LocalCenters(centers=rng.normal(size=(k, d)).astype(dtype),
                        counts=rng.integers(1, 9, size=k).astype(np.int64))


def test_choose_byzantine_count_seed_and_order():
    ids = list(range(50))
    a = choose_byzantine(ids, 0.2, 3)
    assert len(a) == 10 and a == sorted(a) and set(a) <= set(ids)
    assert choose_byzantine(ids[::-1], 0.2, 3) == a
    assert choose_byzantine(ids, 0.2, 4) != a
    assert choose_byzantine(ids, 0.0, 3) == []
    for bad in (0.5, 0.7, -0.1):
        with pytest.raises(ValidationError, match="alpha"):
            choose_byzantine(ids, bad, 0)


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lies_stay_well_formed_and_counts_honest(attack, dtype):
    msg = _msg(dtype=dtype)
    kw = {"between": (np.zeros(5), np.ones(5))} if attack == "between" else {}
    t = ByzantineTamper(range(10), random_state=0, attack=attack, scale=1e30, devices=[2], **kw)
    honest = msg.to_arrays()
    out = t(2, 0, honest)
    assert out.keys() == honest.keys()
    for name in honest:
        assert out[name].shape == honest[name].shape and out[name].dtype == honest[name].dtype
        assert np.isfinite(out[name]).all()
    np.testing.assert_array_equal(out["counts"], honest["counts"])
    LocalCenters.from_arrays(out, sender="device 2")   # validates: a lie, not a malformed message
    scalar = t(2, 0, {"loss": np.float64(0.5), "n": np.int64(3)})   # 0-d fields stay 0-d
    assert scalar["loss"].shape == () and scalar["n"] == 3
    assert t(3, 0, honest) is honest                   # honest devices are untouched
    assert t.calls == 2


def test_attack_semantics():
    msg = _msg(1)
    C = msg.centers
    liar = lambda attack, **kw: ByzantineTamper(range(4), random_state=5, attack=attack,
                                                devices=[0, 1], **kw)
    np.testing.assert_array_equal(liar("sign-flip", scale=1.0)(0, 0, msg.to_arrays())["centers"], -C)
    np.testing.assert_array_equal(liar("scale", scale=7.0)(0, 0, msg.to_arrays())["centers"], 7 * C)
    big = liar("large-norm", scale=100.0)
    a, b = big(0, 0, msg.to_arrays())["centers"], big(0, 1, msg.to_arrays())["centers"]
    assert 50 < np.abs(a).std() < 200 and not np.array_equal(a, b)
    np.testing.assert_array_equal(a, liar("large-norm", scale=100.0)(0, 0, msg.to_arrays())["centers"])
    col = liar("collude", scale=50.0)
    x, y = col(0, 0, msg.to_arrays())["centers"], col(1, 0, msg.to_arrays())["centers"]
    np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 50.0)
    tgt = np.arange(5.0)
    np.testing.assert_array_equal(liar("collude", target=tgt)(0, 0, msg.to_arrays())["centers"],
                                  np.tile(tgt, (3, 1)))
    lo, hi = np.zeros(5), np.full(5, 4.0)
    rows = liar("between", between=(lo, hi))(1, 0, msg.to_arrays())["centers"]
    t = rows[:, 0] / 4.0
    assert ((t >= 0.25) & (t <= 0.75)).all()
    np.testing.assert_allclose(rows, t[:, None] * hi, atol=1e-12)
    only = ByzantineTamper(range(4), devices=[0], attack="scale", scale=2.0, fields=["nothing"])
    np.testing.assert_array_equal(only(0, 0, msg.to_arrays())["centers"], C)


def test_tamper_bad_parameters():
    with pytest.raises(ValidationError, match="attack"):
        ByzantineTamper(range(4), attack="nice")
    with pytest.raises(ValidationError, match="between"):
        ByzantineTamper(range(4), attack="between")
    with pytest.raises(ValidationError, match="not in the federation"):
        ByzantineTamper(range(4), devices=[9])
    with pytest.raises(ValidationError, match="alpha"):
        ByzantineTamper(range(4), alpha=0.5)


def _honest_accuracy(model, fd, honest):
    pred = np.concatenate([model.device_labels_[z] for z in honest])
    true = np.concatenate([fd.labels[z] for z in honest])
    C = np.zeros((true.max() + 1, max(pred.max(), true.max()) + 1))
    np.add.at(C, (true, pred), 1)
    r, c = linear_sum_assignment(-C)
    return C[r, c].sum() / len(true)


@pytest.mark.parametrize("attack", ["large-norm", "collude"])
def test_kfed_under_attack_through_inprocess_transport(attack):
    fd = make_federated_gaussians(20, 8, 2, 5, 100.0, 40, random_state=0)
    ids = list(range(fd.n_devices))
    clean = KFed(8, 2, server="farthest-lloyd1", random_state=0).fit(fd.devices)
    t = ByzantineTamper(ids, 0.2, 0, attack=attack, scale=1e4)
    honest = [z for z in ids if z not in t.byzantine]
    attacked = KFed(8, 2, server="farthest-lloyd1", random_state=0).fit(
        fd.devices, transport=InProcessTransport(tamper=t))
    # the lies arrive well-formed: nobody is rejected and the liars' centers are the lies
    assert attacked.run_log_.rejected == {} and t.calls == len(t.byzantine)
    for z in t.byzantine:
        assert np.abs(attacked.local_centers_[z]).max() > 100
    for z in honest:
        np.testing.assert_array_equal(attacked.local_centers_[z], clean.local_centers_[z])
    assert _honest_accuracy(clean, fd, honest) == 1.0
    # farthest-point seeding takes the lies (colluders waste one center: at most 7/8 + merge)
    assert _honest_accuracy(attacked, fd, honest) < 0.95
    # the same received centers, clustered by trimmed k-means, recover the true means; colluders
    # sending one point form a dense group bigger than an honest cluster (8 vs 5 centers),
    # indistinguishable from a cluster: one spare cluster absorbs them
    received = np.vstack([attacked.local_centers_[z] for z in ids])
    tk = TrimmedKMeans(8 + (attack == "collude"), random_state=0).fit(received)
    err = max(np.linalg.norm(tk.cluster_centers_ - m, axis=1).min() for m in fd.means)
    assert err < 1.0


def test_poison_devices():
    rng = np.random.default_rng(0)
    devs = [rng.normal(size=(10, 3)) for _ in range(10)]
    out, bad = poison_devices(devs, 0.3, 4, attack="shift", scale=100.0)
    assert bad == choose_byzantine(range(10), 0.3, 4) and len(bad) == 3
    for z in range(10):
        if z in bad:
            np.testing.assert_allclose(np.linalg.norm((out[z] - devs[z]).mean(axis=0)), 100.0)
        else:
            assert out[z] is devs[z]
    sup = [(X, X @ np.ones(3)) for X in devs]
    out, bad = poison_devices(sup, 0.2, 1, attack="regression", scale=10.0)
    for z in bad:
        X, y = out[z]
        w = np.linalg.lstsq(X, y, rcond=None)[0]
        assert not np.allclose(w, 1.0)
    cls = [(X, np.arange(10) % 3) for X in devs]
    out, bad = poison_devices(cls, 0.2, 1, attack="label-flip", n_classes=3)
    np.testing.assert_array_equal(out[bad[0]][1], 2 - np.arange(10) % 3)
    with pytest.raises(ValidationError, match="needs \\(X, y\\)"):
        poison_devices(devs, 0.2, 1, attack="regression")
