"""The code on the getting-started and k-FED pages runs, and its TOML is a valid config."""

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from fedclust.config import check_config

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ["getting-started.md", "kfed.md"]


def blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (DOCS / page).read_text(), re.S)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run_in_order(page):
    code = blocks(page, "python")
    assert code, f"{page} has no Python example"
    namespace: dict = {}
    for block in code:
        exec(compile(block, f"{page}", "exec"), namespace)  # noqa: S102 (our own docs)
    model = namespace["model"]
    assert model.cluster_centers_.shape == (16, 100)
    assert model.communication_["rounds"] == 1


def test_toml_blocks_are_valid_configs():
    for block in blocks("getting-started.md", "toml"):
        cfg = check_config(tomllib.loads(block), source="getting-started.md")
        assert cfg["algorithm"]["name"] == "kfed"
