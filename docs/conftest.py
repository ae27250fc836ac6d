"""pytest configuration of the documentation's examples.

The examples of the pages (``*.rst``) run as doctests, one test a page, with
the test suite (``--doctest-glob='*.rst'``). Sphinx's configuration and
extension are not test modules, and a page whose optional dependencies are
not installed is skipped.

The porting pages compare nblstm with results stored by the frameworks
themselves (``tests/fixtures``, described in ``tests/fixtures/README.md``):
their examples get ``fixture(name)``, the path of ``tests/fixtures/<name>``
whatever directory pytest runs from.
"""

import importlib.util
from pathlib import Path

import pytest

collect_ignore = ["conf.py", "_ext", "_build"]

#: Pages that need more than nblstm's own dependencies.
OPTIONAL = {"dask.rst": ("dask", "distributed"), "porting-onnx.rst": ("onnx",)}

for page, modules in OPTIONAL.items():
    if any(importlib.util.find_spec(module) is None for module in modules):
        collect_ignore.append(page)

#: The frameworks' stored results, next to the tests that use them too.
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def fixture(name):
    """The path (a ``str``) of the stored results ``tests/fixtures/<name>``, e.g. ``fixture("torch_layers.npz")``."""
    path = FIXTURES / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the porting pages need the repository's tests/fixtures")
    return str(path)


@pytest.fixture(autouse=True)
def _porting_fixtures(doctest_namespace):
    doctest_namespace["fixture"] = fixture
