"""The package's imports run one way: no import cycle between modules, no private name
taken across modules, and flower/ reaches neither experiment.py nor the site wing.

Every ``import`` / ``from ... import`` in ``src/fedclust`` counts, those inside
functions too (a lazy import is still a dependency). Read with :mod:`ast`, nothing
is imported. The checks are shown to bite on a planted cycle in a temporary package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, package: str) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(root: Path, package: str) -> list[tuple[str, str, str]]:
    """``(importer, imported module, name taken)`` for every import inside ``package``."""
    modules = _modules(root, package)
    edges = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target:
                        edges.append((name, target, alias.name.rpartition(".")[2]))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:  # ``from pkg import module``
                        edges.append((name, sub, alias.name))
                    elif base in modules:
                        edges.append((name, base, alias.name))
    return [(a, b, n) for a, b, n in edges if a != b]


def import_graph(root: Path, package: str) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(_modules(root, package))
    graph.add_edges_from((a, b) for a, b, _ in import_edges(root, package))
    return graph


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """The strongly connected groups of more than one module (each holds a cycle)."""
    graph = import_graph(root, package)
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def private_imports(root: Path, package: str) -> list[str]:
    """``importer -> module: _name`` for each private name taken from another module.

    A package's private module (``gauss/_fast.py``) imported inside that package
    is the package's own business and not counted; its private names are."""
    return [f"{a} -> {b}: {n}" for a, b, n in import_edges(root, package)
            if n.startswith("_") and not n.startswith("__")
            and not (b.rpartition(".")[2] == n and b.rpartition(".")[0] == a.rpartition(".")[0])]



def test_no_import_cycle_in_the_package():
    assert import_cycles(SRC, "fedclust") == []


def test_no_private_name_imported_across_modules():
    found = set(private_imports(SRC, "fedclust"))
    assert found == set()


def test_flower_reaches_neither_the_experiment_nor_the_site_wing():
    graph = import_graph(SRC, "fedclust")
    flower = [m for m in graph if m.startswith("fedclust.flower.") or m == "fedclust.flower"]
    above = {"fedclust.experiment", "fedclust.cli", "fedclust.cli_flower", "fedclust.flower_app"}
    for m in flower:
        direct = {b for _, b in graph.out_edges(m)}
        assert not direct & above, (m, sorted(direct & above))
        assert not {b for b in direct if b == "fedclust.sites" or
                    b.startswith("fedclust.sites.")}, m


def test_the_site_wing_reaches_families_only_through_the_registry():
    graph = import_graph(SRC, "fedclust")
    families = ("kfed", "lloyd", "coreset", "gauss", "fl", "robust", "unlearning", "flower")
    for a, b in graph.edges:
        if a.startswith("fedclust.sites"):
            assert b.split(".")[1] not in families, (a, b)
            assert b not in ("fedclust.experiment", "fedclust.cli", "fedclust.cli_flower",
                             "fedclust.flower_app"), (a, b)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, cycle", [
    # a lazy import back up closes a cycle
    ({"__init__.py": "", "low.py": "def f():\n    from .high import g\n",
      "high.py": "from .low import f\n"}, ["pkg.high", "pkg.low"]),
    # through a sub-package and a ``from . import module``
    ({"__init__.py": "", "a.py": "from .sub import b\n", "sub/__init__.py": "",
      "sub/b.py": "from .. import a\n"}, ["pkg.a", "pkg.sub.b"]),
    # an absolute import counts too
    ({"__init__.py": "", "a.py": "import pkg.b\n", "b.py": "from pkg.a import x\n"},
     ["pkg.a", "pkg.b"]),
])
def test_a_planted_cycle_is_found(tmp_path, files, cycle):
    root = _package(tmp_path, files)
    assert import_cycles(root, "pkg") == [cycle]


def test_a_one_way_package_has_no_cycle(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "low.py": "X = 1\n",
                               "high.py": "from .low import X\n\ndef f():\n"
                                          "    from . import low\n"})
    assert import_cycles(root, "pkg") == []


def test_a_planted_private_import_is_found(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "a.py": "_secret = 1\nPUBLIC = 2\n",
                               "b.py": "from .a import PUBLIC, _secret\n"
                                       "from .a import __doc__ as doc\n"})
    assert private_imports(root, "pkg") == ["pkg.b -> pkg.a: _secret"]


def test_a_private_module_of_the_package_is_its_own(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "_fast.py": "_k = 1\n",
                               "a.py": "from . import _fast\n", "sub/__init__.py": "",
                               "sub/b.py": "from .. import _fast\nfrom .._fast import _k\n"})
    assert private_imports(root, "pkg") == ["pkg.sub.b -> pkg._fast: _fast",
                                            "pkg.sub.b -> pkg._fast: _k"]


def test_core_is_the_ground_floor():
    """``core/`` imports nothing else of the package: every other layer stands on it."""
    graph = import_graph(SRC, "fedclust")
    up = sorted((a, b) for a, b in graph.edges
                if a.startswith("fedclust.core.") and not b.startswith("fedclust.core"))
    assert up == []
