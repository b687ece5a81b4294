"""``.. fedclust-cli::``: the command-line reference, rendered from the argparse parser.

Each command and sub-command gets a section with its ``--help`` text, so the
reference cannot drift from what ``fedclust ... --help`` prints.
"""

from __future__ import annotations

import argparse
import os

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(command line, parser) for ``parser`` and every sub-command, depth first."""
    yield prefix or parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix or parser.prog} {name}")


class FedclustCLI(Directive):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from fedclust.cli import build_parser

        os.environ["COLUMNS"] = "90"  # argparse wraps at the terminal width
        text: list[str] = []
        for command, parser in _commands(build_parser()):
            text += [f"``{command}``", "-" * (len(command) + 4), "", ".. code-block:: text", ""]
            text += [f"   {line}".rstrip() for line in parser.format_help().splitlines()]
            text.append("")
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(text, source="fedclust-cli"), node)
        return node.children


def setup(app):
    app.add_directive("fedclust-cli", FedclustCLI)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
