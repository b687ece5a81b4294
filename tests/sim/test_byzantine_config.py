"""A Byzantine tamper hook rebuilt from its config lies exactly as the original (that is how
it reaches the client processes of a Flower simulation)."""

import json

import numpy as np
import pytest

from fedclust.sim.byzantine import ATTACKS, ByzantineTamper


@pytest.mark.parametrize("attack", ATTACKS)
def test_rebuilt_hook_tells_the_same_lies(attack):
    rng = np.random.default_rng(0)
    kw = {"between": (rng.normal(size=3), rng.normal(size=3))} if attack == "between" else {}
    hook = ByzantineTamper(range(10), 0.3, 7, attack=attack, scale=5.0, **kw)
    clone = ByzantineTamper.from_config(json.loads(json.dumps(hook.config())))
    assert clone.byzantine == hook.byzantine and len(hook.byzantine) == 3
    reply = {"centers": rng.normal(size=(4, 3)), "counts": np.arange(4)}
    for z in range(10):
        for r in range(3):
            a, b = hook(z, r, reply), clone(z, r, reply)
            assert a.keys() == b.keys()
            for name in a:
                assert np.array_equal(a[name], b[name])
            lied = not np.array_equal(a["centers"], reply["centers"])
            assert lied == (z in hook.byzantine)
            assert np.array_equal(a["counts"], reply["counts"])  # integer fields stay honest


def test_config_keeps_target_and_fields():
    hook = ByzantineTamper(range(6), 0.0, 1, attack="collude", target=[1.0, 2.0],
                           fields=["centers"], devices=[2, 4])
    clone = ByzantineTamper.from_config(hook.config())
    assert clone.byzantine == [2, 4] and clone.fields == ("centers",)
    assert np.array_equal(clone.target, [1.0, 2.0])
