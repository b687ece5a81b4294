"""The user-facing text describes the code as it is now, for a user.

README.md, docs/, the docstrings and comments of src/, benchmarks/ and examples/
must not carry planning vocabulary or work history (how a number was reached,
which session or pass changed it, targets from a work plan), temporary paths,
or links that leave the repository. History belongs in the git log.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"_build", "api", "__pycache__", "results", "figures"}
SUFFIXES = {".md", ".py", ".toml", ".rst", ".txt"}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in ("docs", "src", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT / folder).parts
            if path.is_file() and path.suffix in SUFFIXES and not SKIP_DIRS & set(rel[:-1]):
                files.append(path)
    return files


_I = re.IGNORECASE
#: (why, pattern): each pattern is specific enough that ordinary prose ("one pass over
#: the data", "the targets y", "before training") does not match it
PATTERNS = [
    # planning vocabulary
    ("refers to a work item", re.compile(
        r"\b(the|this|that|an?) issue\b|\bissue'?s\b|\bissues?\s*#?\d|\(issue\b|\bissue\s+[\"“]",
        _I)),
    ("a work-plan target", re.compile(
        r"\b[Tt]argets?\s*(\(|<=|>=|≤|≥|<|>)|\bTargets?:|\b[Tt]argets?\s+(is\s+|are\s+|was\s+)?"
        r"(met|missed)\b")),
    ("a work-plan marker", re.compile(r"\[decide\]|\bTODO\b|\bFIXME\b|\bXXX\b")),
    ("a seed file number", re.compile(r"\bseed 0\d+\b|\bseed files?\b", _I)),
    # work history
    ("work history (sessions)", re.compile(r"\bsessions?('s)?\b", _I)),
    ("team or plan talk", re.compile(r"\bthe lead('s)?\b|\bnext (thing|step)s? to try\b", _I)),
    ("work history (passes)", re.compile(
        r"\b(previous|earlier) pass\b|\bpass(es)? #?\d+\b|\bnumbered pass", _I)),
    ("work history (earlier runs)", re.compile(
        r"\bearlier (run|version|table|measurement|commit)s?\b|\bprevious (table|commit|"
        r"setting|version|values?)\b|\bre-?measured\b|\bno longer\b|\bold behaviou?r\b|"
        r"\b(after|before) the (fix|change|reshape|random-stream change)\b|"
        r"\bnew this session\b|\(was\b|\bwas (yes|no)\b", _I)),
    ("now against before", re.compile(r"\bnow\b[^.\n]{0,60}\bbefore\b|\bbefore\b[^.\n]{0,60}"
                                      r"\bnow\b|\bbefore/after\b", _I)),
    # paths and links
    ("a temporary or machine-specific path", re.compile(r"(?<![\w.])/(tmp|work|home)/\w")),
    ("a path outside the repository", re.compile(r"\.\./shared\b")),
    ("a file outside the repository", re.compile(r"\b(ARCHITECTURE|ALGORITHMS)\.md\b")),
]

GENERATED = ROOT / "docs" / "api"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside(path: Path, target: str) -> bool:
    """A relative Markdown link whose target resolves outside the repository."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, _I) or target.startswith("#"):
        return False  # a URL (public) or an in-page anchor
    resolved = (path.parent / target.split("#")[0]).resolve()
    return ROOT not in resolved.parents and resolved != ROOT


def _missing(path: Path, target: str) -> bool:
    """A relative link inside the repository to a file that does not exist (a Sphinx
    document may be named without its suffix)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, _I) or target.startswith("#"):
        return False
    resolved = (path.parent / target.split("#")[0]).resolve()
    if GENERATED in resolved.parents:
        return False  # docs/api/ is written by docs/conf.py at build time
    return not any(p.exists() for p in (resolved, resolved.with_name(resolved.name + ".md"),
                                        resolved.with_name(resolved.name + ".rst")))


def problems(path: Path, text: str) -> list[str]:
    rel = path.relative_to(ROOT)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for why, pattern in PATTERNS:
            hit = pattern.search(line)
            if hit:
                out.append(f"{rel}:{number}: {why}: {hit.group(0)!r}")
        # Markdown links: only in Markdown (in code, `f[x](y)` is a call)
        for target in (_LINK.findall(line) if path.suffix == ".md" else ()):
            if _outside(path, target):
                out.append(f"{rel}:{number}: a link leaving the repository: {target!r}")
            elif _missing(path, target):
                out.append(f"{rel}:{number}: a link to a missing file: {target!r}")
    return out


def test_docs_and_docstrings_describe_current_behaviour_only():
    found = [p for path in scanned_files() for p in problems(path, path.read_text())]
    assert not found, "\n" + "\n".join(found)


def test_the_scan_covers_the_documentation_and_the_code():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {"README.md", "docs/index.md", "src/fedclust/cli.py"} <= names
    assert any(n.startswith("benchmarks/") for n in names)
    assert any(n.startswith("examples/") for n in names)


@pytest.mark.parametrize("line", [
    "Target (the issue): ours >= paper - 1 point.",
    "An earlier run under the same load gave 0.295x.",
    "gen_25_5_5 0.829 -> 0.987 (previous pass)",
    "measured in session 4 with the new default",
    "python bench.py --out /tmp/bench_full",
    "MNIST 70k (/work/shared/data, pixels / 255)",
    "Federated learning with self-evolving Gaussian clusters (seed 002; the lineage)",
    "FEDCLUST_DATA=../shared/data fedclust run",
    "Specification: `ALGORITHMS.md` §3.",
    "see [the plan](../shared/docs/ARCHITECTURE.md)",
    "see [the old guide](old-guide.md)",
    "**yes** (was no: 94.6)",
    "k' = 2 now; before it was 0.55",
    "Target <= 0.05 ms: met in CPU time",
    "the last session's -55 % was one lucky seed",
    "is the lead's, not here",
    "is the next thing to try.",
    "Targets: ours within 1 point",
])
def test_planning_and_history_lines_are_caught(line, tmp_path):
    assert problems(ROOT / "docs" / "x.md", line)


@pytest.mark.parametrize("line", [
    "Learning a sample (one pass, online):",
    "the owners' third pass over the rows",
    "``fed.labels`` are the targets ``y`` for supervised families",
    "same target size t; the union is solved by weighted k-means",
    "before training with k = 10",
    "pass l2 > 0 to regularise",
    "a device that was absent at fit time",
    "see [the Flower guide](flower.md) and [Flower](https://flower.ai)",
    "[examples](../examples/coreset_star.toml)",
    "collude with a ``target`` point",
    "    for z in targets:",
    "    def send(self, request, targets: list[int]):",
    "    target : array-like (p,), optional",
    "this pass only confirmed the previous update",
    "federation and run seed 0, 1, 2",
    'ray_tmp = mkdtemp(dir="/tmp")',
])
def test_ordinary_prose_is_not_flagged(line):
    assert not problems(ROOT / "docs" / "x.md", line)
