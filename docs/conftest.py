"""pytest configuration of the documentation's examples.

The examples of the pages (``*.rst``) run as doctests, one test a page, with
the test suite (``--doctest-glob='*.rst'``). Sphinx's configuration and
extension are not test modules, and a page whose optional dependencies are
not installed is skipped.
"""

import importlib.util

collect_ignore = ["conf.py", "_ext", "_build"]

#: Pages that need more than nblstm's own dependencies.
OPTIONAL = {"dask.rst": ("dask", "distributed")}

for page, modules in OPTIONAL.items():
    if any(importlib.util.find_spec(module) is None for module in modules):
        collect_ignore.append(page)
