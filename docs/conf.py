"""Sphinx configuration of the fedclust documentation (``make docs``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))

import fedclust  # noqa: E402

from api_pages import write_api_pages  # noqa: E402

project = "fedclust"
author = "the fedclust developers"
copyright = "the fedclust developers"
version = release = fedclust.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "fedclust_cli",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_templates", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

# The guides are Markdown (MyST); headings get anchors for in-page links.
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# API reference: one autosummary page per public name (written before the build reads).
write_api_pages(HERE / "api")
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "exclude-members": "__init__"}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"fedclust {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []
# Pages without sub-pages need no section navigation on the left.
html_sidebars = {page: [] for page in ("index", "getting-started", "flower", "reproducing", "cli")}


def _skip_sklearn_plumbing(app, what, name, obj, skip, options):
    """Methods inherited from scikit-learn (``get_params``, ``set_output``, the metadata-routing
    ``set_fit_request``, ...) are documented by scikit-learn, not here."""
    if re.fullmatch(r"set_\w+_request|get_metadata_routing", name):
        return True
    if str(getattr(obj, "__module__", "") or "").startswith("sklearn."):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_sklearn_plumbing)
