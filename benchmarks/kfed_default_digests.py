"""Digests of default KFed() results (centers, center labels, device labels, forget) on the
natural federations and the unlearning benchmark's federation: run under two versions of
the code, compare the JSON files."""
import hashlib, json, sys, warnings
sys.path.insert(0, sys.argv[2])   # the benchmarks folder
import numpy as np
import real_federations as rf
import unlearning as ub
from fedclust import KFed

def dig(m):
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(m.cluster_centers_).tobytes())
    for a in m.center_labels_:
        h.update(b"|" + (b"-" if a is None else np.asarray(a).tobytes()))
    for a in m.device_labels_:
        h.update(b"|" + (b"-" if a is None else np.asarray(a).tobytes()))
    return h.hexdigest()[:16]

out = {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for name, load in {**rf.FEDERATIONS, **rf.HELD_OUT, **rf.NEW_HELD_OUT}.items():
        try:
            devices, ys = load(__import__("pathlib").Path("/work/shared/data"))
        except FileNotFoundError:
            continue
        for seed in (0, 1):
            for kp in (2, 3, 5, "auto"):
                m = KFed(3, random_state=seed) if kp == "auto" else KFed(3, kp, random_state=seed)
                m.fit(devices)
                out[f"{name}/{kp}/{seed}"] = dig(m)
            m = KFed(3, 3, random_state=seed).fit(devices)
            m.forget([0])
            out[f"{name}/forget/{seed}"] = dig(m) + "/" + m.forget_log_[-1].path
        print(name, flush=True)
    devs = ub.federation(1000, 1000, 50, 20, 5, 0)
    m = KFed(20, 5, random_state=0).fit(devs, device_ids=list(range(1000)))
    out["unlearning/fit"] = dig(m)
    out["unlearning/pieces"] = int(sum(len(c) for c in m.local_centers_))
    for z in (3, 500):
        m.forget([z])
        out[f"unlearning/forget{z}"] = dig(m) + "/" + m.forget_log_[-1].path
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
print(len(out), "digests")
