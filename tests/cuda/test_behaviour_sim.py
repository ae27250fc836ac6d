"""The behaviour snapshot of the GPU path, in Numba's CUDA simulator.

``scripts/check_behaviour.py --cudasim --check tests/fixtures/behaviour_cudasim.npz``
runs a few very small cases through the public API with simulator arrays
(in a subprocess, which chooses the simulator itself) and compares every
result bitwise with the saved one. The simulator computes with NumPy on the
host, so the test is skipped where the CPU, numba, numba-cuda, SciPy or
NumPy differ from those recorded in the snapshot's metadata.
"""

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_behaviour.py"
SNAPSHOT = ROOT / "tests" / "fixtures" / "behaviour_cudasim.npz"


def saved_metadata(path):
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["__metadata__"]))


def environment_differences(saved):
    """What differs between this environment and the one that saved the snapshot (empty when nothing)."""
    import llvmlite.binding as llvm
    import numba
    import scipy

    try:
        numba_cuda = version("numba-cuda")
    except PackageNotFoundError:
        numba_cuda = None
    here = {
        "numba": numba.__version__,
        "numba_cuda": numba_cuda,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "cpu_name": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
    }
    return [f"{key}: {here[key]!r} here, {saved.get(key)!r} saved" for key in here if here[key] != saved.get(key)]


def test_simulator_results_are_bitwise_those_of_the_snapshot():
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed")
    differences = environment_differences(saved_metadata(SNAPSHOT))
    if differences:
        pytest.skip("the snapshot was saved in another environment (" + "; ".join(differences) + ")")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--cudasim", "--check", str(SNAPSHOT)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    assert f"nblstm imported from {ROOT / 'nblstm'}" in output, output[-4000:]
    assert result.returncode == 0, output[-8000:]
