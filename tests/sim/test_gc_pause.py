"""The in-process run pauses the cyclic garbage collector and always restores it."""

import gc
import threading

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.exceptions import ValidationError
from fedclust.sim.gc_pause import cyclic_gc_paused
from fedclust.sim.transport import InProcessTransport


def _devices(seed=0, n=30):
    rng = np.random.default_rng(seed)
    return [np.vstack([rng.normal(0, 1, (10, 3)), rng.normal(20, 1, (10, 3))]) for _ in range(n)]


@pytest.fixture
def gc_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_a_run_pauses_the_collector_and_restores_it(gc_enabled):
    seen = []

    def watch(z, round_index, arrays):   # called on the wire, inside the run
        seen.append(gc.isenabled())
        return arrays

    paused = KFed(2, 2, random_state=0).fit(_devices(), transport=InProcessTransport(tamper=watch))
    assert seen and not any(seen)
    assert gc.isenabled()
    plain = KFed(2, 2, random_state=0).fit(_devices())
    np.testing.assert_array_equal(paused.cluster_centers_, plain.cluster_centers_)


def test_a_failing_run_restores_the_collector(gc_enabled):
    with pytest.raises(ValidationError, match="dropout"):
        KFed(2, 2, random_state=0).fit(_devices(), transport=InProcessTransport(dropout=2.0))
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    was = gc.isenabled()
    gc.disable()
    try:
        KFed(2, 2, random_state=0).fit(_devices())
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_nested_and_threaded_pauses_resume_once_the_last_ends(gc_enabled):
    inner_done, outer_may_end = threading.Event(), threading.Event()
    states = {}

    def other():
        with cyclic_gc_paused():
            inner_done.set()
            outer_may_end.wait(5)
        states["after_thread"] = gc.isenabled()

    with cyclic_gc_paused():
        t = threading.Thread(target=other)
        t.start()
        inner_done.wait(5)
        with cyclic_gc_paused():
            pass
        states["after_nested"] = gc.isenabled()
    states["after_outer"] = gc.isenabled()   # the thread still holds it
    outer_may_end.set()
    t.join(5)
    assert states == {"after_nested": False, "after_outer": False, "after_thread": True}
    assert gc.isenabled()


def test_a_streamed_fit_leaves_the_collector_on(gc_enabled):
    seen = []

    def devices():
        for X in _devices():
            seen.append(gc.isenabled())
            yield X

    KFed(2, 2, random_state=0).fit(devices())
    assert seen and all(seen)
