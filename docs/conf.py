"""Sphinx configuration of the nblstm documentation.

Build with ``sphinx-build -W -b html docs docs/_build/html`` (warnings are errors).
"""

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

import nblstm  # noqa: E402

project = "nblstm"
author = "the nblstm authors"
copyright = "the nblstm authors, Apache-2.0"
release = nblstm.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "nblstm_docs",
]
# Markdown pages written by others (benchmarks.md) are parsed by MyST when it is installed.
if importlib.util.find_spec("myst_parser") is not None:
    extensions.append("myst_parser")
    myst_heading_anchors = 3

exclude_patterns = ["_build", "**/_build", "*.md"]  # .md files are included by pages, not pages themselves
templates_path = []
html_static_path = []
html_theme = "alabaster"
html_title = f"nblstm {release}"

# Optional dependencies whose absence must not hide the API pages that mention them.
autodoc_mock_imports = ["dask", "distributed"]
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
