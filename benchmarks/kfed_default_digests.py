"""Digests of default KFed() results on the natural federations and the unlearning benchmark.

Each digest is a SHA-256 of the final centers, every device center's label and every
device row's label, bit for bit: ``KFed(3, k')`` for k' in {2, 3, 5, "auto"} and seeds 0, 1
on every federation of ``real_federations.py`` (skipped where its data is absent), a forget
of the first device (with the forget's path), the same forget by ``KFed(3)`` followed by a
deletion of a tenth of the second device's rows, and the unlearning benchmark's federation
(1,000 devices x 1,000 points, d = 50, k = 20, k' = 5: 19,000 device centers) fitted,
forgetting two devices and deleting ten rows of two others. Every row deletion is also
compared with a fresh fit on the remaining rows (a digest ending in ``/differs-from-fresh``
is a bug). Run it under two versions of the code and compare the JSON files:
``python benchmarks/kfed_default_digests.py OUT.json`` (``--data-dir`` as the other
benchmarks).
"""
import argparse
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

import _common as C
import real_federations as rf
import unlearning as ub
from fedclust import KFed
from fedclust.core.exceptions import TooFewReplies, ValidationError


def dig(m) -> str:
    """The digest of a fitted model's centers and labels."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(m.cluster_centers_).tobytes())
    for a in m.center_labels_:
        h.update(b"|" + (b"-" if a is None else np.asarray(a).tobytes()))
    for a in m.device_labels_:
        h.update(b"|" + (b"-" if a is None else np.asarray(a).tobytes()))
    return h.hexdigest()[:16]


def delete_rows(m, devices: list, z: int, rows, make, gone: list) -> str:
    """Delete ``rows`` of device ``z`` (ids are positions) from the fitted ``m`` and from
    ``devices`` (in place); the digest, the forget's path, and whether a fresh ``make()``
    fit on the remaining devices and rows gives the same digest."""
    m.forget(rows={z: [int(r) for r in rows]}, relabel=True)
    devices[z] = np.delete(devices[z], rows, axis=0)
    keep = [i for i in range(len(devices)) if i not in gone]
    fresh = make().fit([devices[i] for i in keep], device_ids=keep)
    mine = dig(m)
    same = "" if dig(fresh) == mine else "/differs-from-fresh"
    return mine + "/" + m.forget_log_[-1].path + same


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--data-dir", type=Path, default=None)
    args = p.parse_args()
    data_dir = args.data_dir or C.default_data_dir()
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, load in {**rf.FEDERATIONS, **rf.HELD_OUT, **rf.NEW_HELD_OUT}.items():
            try:
                devices, ys = load(data_dir)
            except FileNotFoundError:
                continue
            for seed in (0, 1):
                for kp in (2, 3, 5, "auto"):
                    m = KFed(3, random_state=seed) if kp == "auto" else KFed(3, kp, random_state=seed)
                    m.fit(devices)
                    out[f"{name}/{kp}/{seed}"] = dig(m)
                auto = m   # KFed(3): summaries sized by the devices
                m = KFed(3, 3, random_state=seed).fit(devices)
                m.forget([0])
                out[f"{name}/forget/{seed}"] = dig(m) + "/" + m.forget_log_[-1].path
                try:
                    auto.forget([0])
                except (TooFewReplies, ValidationError):   # as a fresh fit: the rest would
                    # send fewer than k centers
                    out[f"{name}/rows/{seed}"] = "too few centers after the forget"
                    continue
                kept = list(devices)
                rows = np.random.default_rng(7 + seed).choice(
                    len(kept[1]), size=max(1, len(kept[1]) // 10), replace=False)
                out[f"{name}/rows/{seed}"] = delete_rows(auto, kept, 1, rows, lambda: KFed(
                    3, random_state=seed), gone=[0])
            print(name, flush=True)
        devs = ub.federation(1000, 1000, 50, 20, 5, 0)
        m = KFed(20, 5, random_state=0).fit(devs, device_ids=list(range(1000)))
        out["unlearning/fit"] = dig(m)
        out["unlearning/pieces"] = int(sum(len(c) for c in m.local_centers_))
        for z in (3, 500):
            m.forget([z])
            out[f"unlearning/forget{z}"] = dig(m) + "/" + m.forget_log_[-1].path
        for z in (7, 900):
            rows = np.random.default_rng(z).choice(1000, size=10, replace=False)
            out[f"unlearning/rows{z}"] = delete_rows(m, devs, z, rows, lambda: KFed(
                20, 5, random_state=0), gone=[3, 500])
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True))
    print(len(out), "digests")


if __name__ == "__main__":
    main()
