"""Sphinx configuration of mcplive's documentation site.

Build it with ``tox -e docs``, or from the repository's root::

    python3 -m pip install -e '.[docs]'
    sphinx-build -W --keep-going -b html docs docs/_build/html

The pages are MyST Markdown; the API reference pages are reStructuredText, because autodoc
writes reStructuredText. The build needs nothing beyond the ``docs`` extra: no network (no
intersphinx), no graphviz (the architecture diagram is text).
"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# autodoc imports the code of this checkout, also when mcplive is not installed
sys.path.insert(0, str(ROOT))

project = "mcplive"
author = "the mcplive authors"
copyright = "the mcplive authors"
# the version of this checkout, as setup.cfg says (the installed one may be another)
_setup = configparser.ConfigParser()
_setup.read(ROOT / "setup.cfg", encoding="utf-8")
release = _setup["metadata"]["version"]
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# a code block that names no language is shown as plain text
highlight_language = "text"

# -- MyST -------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
# "## Heading" gets an anchor, so pages can link to [a section](page.md#a-section)
myst_heading_anchors = 3

# -- autodoc ----------------------------------------------------------------------------------
# The docstrings are reStructuredText with ``literals`` and :class:`roles`; no napoleon.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# how the toolkit's records convert to and from the wire is its own business
autodoc_default_options = {"exclude-members": "from_params, from_result, to_wire"}
# Cross references into modules the site does not document (protocol.*, store.*, the wings'
# inner modules) stay plain text: nitpicky stays off, so they are no warnings.
nitpicky = False

# -- HTML -------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"mcplive {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}
