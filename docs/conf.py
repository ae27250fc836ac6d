"""Sphinx configuration of the nblstm documentation.

Build with ``sphinx-build -W -b html docs docs/_build/html`` (warnings are errors).
The built site loads nothing from the network: the theme's assets and MathJax
are served from its own ``_static`` folder.
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
    "myst_parser",
    "nblstm_docs",
]
myst_heading_anchors = 3

# The Markdown reports below are parts of the performance page (included there), not pages.
exclude_patterns = ["_build", "**/_build", "benchmarks.md", "benchmarks-loaded.md", "variants.md", "startup.md",
                    "layers-benchmark.md", "torch-benchmark.md"]
templates_path = []

# -- Math: MathJax 3 served with the site, never from a CDN ---------------------------------------
# The sphinx-mathjax-offline package (the docs extra) ships MathJax's files; they are copied to
# _static/mathjax/ like any static file, and the pages load them from there.
_mathjax = importlib.util.find_spec("sphinx-mathjax-offline")
if _mathjax is None or _mathjax.origin is None:
    raise RuntimeError('the documentation needs MathJax from the sphinx-mathjax-offline package: pip install ".[docs]"')
html_static_path = ["_static", str(Path(_mathjax.origin).parent / "static")]
mathjax_path = "mathjax/tex-chtml.js"

# -- Theme --------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"nblstm {release}"
html_css_files = ["nblstm.css"]
html_show_sourcelink = False

# -- API reference --------------------------------------------------------------------------------
# Optional dependencies whose absence must not hide the API pages that mention them.
autodoc_mock_imports = ["dask", "distributed", "torch"]
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
