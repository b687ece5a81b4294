"""Every configuration in examples/ is valid, says which transports it runs on, and
every family has one that runs on both (on Flower a general graph runs with the server as a
relay between neighbours)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedclust.cli import main
from fedclust.config import load_config
from fedclust.core.registry import DEMOS

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
_MARK = re.compile(r"^# transports: (?P<list>[a-z, ]+)", re.M)


def transports(path: Path) -> set[str]:
    match = _MARK.search(path.read_text())
    assert match, f"{path.name}: no '# transports: ...' line"
    return {t.strip() for t in match["list"].split(",") if t.strip()}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_validates_and_names_its_transports(path):
    cfg = load_config(path)        # structure, keys, [simulation] values
    marked = transports(path)
    assert marked <= {"inprocess", "flower"} and "inprocess" in marked


def test_every_family_has_an_example_for_both_transports():
    both = {load_config(p)["algorithm"]["name"] for p in EXAMPLES
            if transports(p) == {"inprocess", "flower"}}
    families = {cfg["algorithm"]["name"] for cfg in DEMOS.values()}
    assert families <= both, f"no two-transport example for {sorted(families - both)}"


def test_the_general_graph_example_is_marked_for_both_transports():
    lowrank = next(p for p in EXAMPLES if p.name == "coreset_lowrank.toml")
    assert load_config(lowrank)["algorithm"]["graph"] == "gnp"
    assert transports(lowrank) == {"inprocess", "flower"}


@pytest.mark.slow
def test_star_coreset_example_gives_the_same_centers_on_both_transports(tmp_path):
    pytest.importorskip("flwr")
    path = next(p for p in EXAMPLES if p.name == "coreset_star.toml")
    centers = {}
    for transport in ("inprocess", "flower"):
        out = tmp_path / transport
        assert main(["run", str(path), "--out", str(out), "--transport", transport,
                     "--no-plot"]) == 0
        centers[transport] = np.array(json.loads((out / "result.json").read_text())
                                      ["cluster_centers"])
    # same seed, same protocol: equal up to the last bits of BLAS sums
    np.testing.assert_allclose(centers["flower"], centers["inprocess"], rtol=0, atol=1e-9)
