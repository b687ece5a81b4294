"""What a new user follows in the docs: the own-data guide is reachable from the first
pages, and a deployment's commands come in an order that works."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _blocks(text: str) -> list[str]:
    """The fenced code blocks of a markdown text."""
    return re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", text, flags=re.M | re.S)


def flwr_before_its_connection(text: str) -> list[str]:
    """Lines that run ``flwr ... NAME`` above the ``[superlink.NAME]`` of the
    ``config.toml`` their block writes: run then, ``flwr`` does not know NAME yet."""
    bad = []
    for block in _blocks(text):
        for name in re.findall(r"^\[superlink\.([\w-]+)\]", block, flags=re.M):
            defined = block.index(f"[superlink.{name}]")
            command = rf"\bflwr(?: [\w.$/<>-]+)*? {re.escape(name)}\b"  # flwr WORDS... NAME
            for m in re.finditer(rf"^.*{command}.*$", block, flags=re.M):
                if m.start() < defined:
                    bad.append(m.group(0).strip())
    return bad


def test_the_check_finds_a_flwr_command_before_its_connection():
    wrong = ("```bash\n# (wait until `flwr supernode ls local` succeeds)\n"
             "cat > config.toml <<EOF\n[superlink.local]\naddress = \"x\"\nEOF\n```\n")
    right = ("```bash\ncat > config.toml <<EOF\n[superlink.local]\naddress = \"x\"\nEOF\n"
             "until flwr supernode ls local; do sleep 1; done\n```\n")
    assert flwr_before_its_connection(wrong) == ["# (wait until `flwr supernode ls local` "
                                                 "succeeds)"]
    assert flwr_before_its_connection(right) == []


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_no_flwr_command_comes_before_its_connection_is_written(page):
    assert flwr_before_its_connection((DOCS / page).read_text()) == []


def test_the_guide_waits_for_the_superlink_after_writing_the_connection():
    text = (DOCS / "flower.md").read_text()
    assert text.index("[superlink.local]") < text.index("flwr supernode ls local")


@pytest.mark.parametrize("page", ["index.md", "getting-started.md"])
def test_first_pages_lead_to_the_own_data_guide(page):
    text = (DOCS / page).read_text()
    assert re.search(r"\]\((?:\./)?sites\.md(?:#[\w-]+)?\)", text), page
