"""Federations for clustered FL: rotated digits / MNIST (Table 2) and label-skewed MNIST (Figure 4).

``rotated_federation``: Ghosh et al.'s (2020) rotated MNIST, as in the k-FED
paper's Table 2. Images are rotated by 0/90/180/270 degrees (4 clusters). With
``n_local_clusters=1`` every device holds images of one rotation; with 2 it
holds two rotations (half each). Every device also gets held-out test images
(from the test split) with the same rotation mix. Training images are drawn
without replacement from the training split, so devices do not share images.

``label_skew_federation``: the client-selection setting of the k-FED paper's
Figure 4 (Cho et al. 2020's construction): each device holds 2 classes, sizes
follow a power law; test images of the same two classes per device.

``dataset="digits"`` uses scikit-learn's 8x8 digits (1797 images, no download)
so tests, demos and ``--quick`` runs need no data directory.
"""

from __future__ import annotations


import numpy as np

from ..core.exceptions import ValidationError
from ..core.registry import Federation
from ..core.validation import check_choice, check_int

__all__ = ["load_images", "rotate_images", "rotated_federation", "label_skew_federation"]


def load_images(dataset: str = "digits", data_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(X_train, y_train, X_test, y_test, side) with pixels in [0, 1].

    ``"mnist"``: ``mnist_70k.npz`` (60000 / 10000); ``"digits"``: scikit-learn's
    digits split 1297 / 500 by a fixed permutation.
    """
    check_choice(dataset, "dataset", ("digits", "mnist"))
    if dataset == "mnist":
        from ..datasets import load_mnist

        Xtr, ytr = load_mnist(data_dir, subset="train", dtype=np.float32)
        Xte, yte = load_mnist(data_dir, subset="test", dtype=np.float32)
        return Xtr, ytr, Xte, yte, 28
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    perm = np.random.default_rng(12345).permutation(len(X))
    tr, te = perm[:1297], perm[1297:]
    return X[tr], y[tr].astype(np.int64), X[te], y[te].astype(np.int64), 8


def rotate_images(X: np.ndarray, quarter_turns: int, side: int) -> np.ndarray:
    """Rotate flattened square images by ``90 * quarter_turns`` degrees."""
    return np.rot90(X.reshape(-1, side, side), quarter_turns, axes=(1, 2)).reshape(len(X), -1)


def rotated_federation(seed: int, *, n_devices: int = 100, n_local_clusters: int = 1,
                       n_rotations: int = 4, n_train: int = 500, n_test: int = 100,
                       dataset: str = "digits", data_dir: str | None = None,
                       replace: bool | None = None) -> Federation:
    """Rotated-image federation (Table 2). ``extra["rotations"]``: each device's rotations;
    ``extra["point_rotations"]``: the rotation of every training image.

    Device z gets rotation group ``z mod n_rotations`` (k' = 1) or the groups
    ``{z, z + 1} mod n_rotations`` (k' = 2); ``n_train`` / ``n_test`` images in
    all, split evenly over its rotations. ``replace=None`` draws training images
    without replacement while the split has enough of them, else with.
    """
    n_devices = check_int(n_devices, "n_devices", min_value=1)
    kl = check_int(n_local_clusters, "n_local_clusters", min_value=1)
    R = check_int(n_rotations, "n_rotations", min_value=1, max_value=4)
    if kl > R:
        raise ValidationError(f"n_local_clusters={kl} > n_rotations={R}")
    n_train = check_int(n_train, "n_train", min_value=kl)
    n_test = check_int(n_test, "n_test", min_value=kl)
    Xtr, ytr, Xte, yte, side = load_images(dataset, data_dir)
    rng = np.random.default_rng(seed)
    if replace is None:
        replace = n_devices * n_train > len(Xtr)
    pool = rng.permutation(len(Xtr))
    pos = 0
    devices, labels, tdev, tlab, rots, point_rots = [], [], [], [], [], []
    for z in range(n_devices):
        groups = [(z + j) % R for j in range(kl)]
        per = np.diff(np.linspace(0, n_train, kl + 1).astype(int))
        per_t = np.diff(np.linspace(0, n_test, kl + 1).astype(int))
        Xs, ys, Ts, tys = [], [], [], []
        for g, n_g, t_g in zip(groups, per, per_t):
            if replace:
                idx = rng.choice(len(Xtr), n_g, replace=False)
            else:
                idx = pool[pos:pos + n_g]
                pos += n_g
            jdx = rng.choice(len(Xte), t_g, replace=False)
            Xs.append(rotate_images(Xtr[idx], g, side))
            ys.append(ytr[idx])
            Ts.append(rotate_images(Xte[jdx], g, side))
            tys.append(yte[jdx])
        devices.append(np.concatenate(Xs).astype(np.float64))
        labels.append(np.concatenate(ys).astype(np.int64))
        tdev.append(np.concatenate(Ts).astype(np.float64))
        tlab.append(np.concatenate(tys).astype(np.int64))
        rots.append(groups)
        point_rots.append(np.repeat(groups, per).astype(np.int64))
    desc = (f"rotated {dataset} ({R} rotations, {n_devices} devices, k'={kl}, "
            f"{n_train} train / {n_test} test images per device)")
    return Federation(devices, labels, desc, tdev, tlab, extra={"rotations": rots, "point_rotations": point_rots})


def label_skew_federation(seed: int, *, n_devices: int = 500, classes_per_device: int = 2,
                          min_size: int = 20, alpha: float = 1.5, max_size: int = 600,
                          n_test: int = 50, dataset: str = "digits",
                          data_dir: str | None = None) -> Federation:
    """Label-skewed federation with power-law sizes (Figure 4).

    Device z holds ``classes_per_device`` classes (consecutive, starting at a
    random class) and ``min_size * Pareto(alpha)`` images (capped at
    ``max_size``), drawn with replacement across devices; ``n_test`` test
    images of its classes. ``extra["classes"]``: each device's classes.
    """
    n_devices = check_int(n_devices, "n_devices", min_value=1)
    cpd = check_int(classes_per_device, "classes_per_device", min_value=1, max_value=10)
    Xtr, ytr, Xte, yte, _ = load_images(dataset, data_dir)
    rng = np.random.default_rng(seed)
    by_tr = [np.flatnonzero(ytr == c) for c in range(10)]
    by_te = [np.flatnonzero(yte == c) for c in range(10)]
    sizes = np.minimum((min_size * (1.0 + rng.pareto(alpha, n_devices))).astype(int), max_size)
    devices, labels, tdev, tlab, cls = [], [], [], [], []
    for z in range(n_devices):
        first = int(rng.integers(10))
        classes = [(first + j) % 10 for j in range(cpd)]
        idx = np.concatenate([rng.choice(by_tr[c], int(s)) for c, s in
                              zip(classes, np.diff(np.linspace(0, sizes[z], cpd + 1).astype(int)))])
        jdx = np.concatenate([rng.choice(by_te[c], max(1, n_test // cpd)) for c in classes])
        devices.append(Xtr[idx].astype(np.float64))
        labels.append(ytr[idx].astype(np.int64))
        tdev.append(Xte[jdx].astype(np.float64))
        tlab.append(yte[jdx].astype(np.int64))
        cls.append(classes)
    desc = (f"label-skewed {dataset} ({n_devices} devices, {cpd} classes each, power-law sizes "
            f"{int(sizes.min())}..{int(sizes.max())})")
    return Federation(devices, labels, desc, tdev, tlab,
                      extra={"classes": cls, "sizes": sizes.tolist()})

