"""The behaviour snapshot: the package computes, bit for bit, what the commit that saved it computed.

``scripts/check_behaviour.py --check tests/fixtures/behaviour_cpu.npz`` runs
every case of the snapshot through the public API and compares each result
bitwise with the saved one. Bitwise results depend on the CPU (LLVM's code),
numba, SciPy's BLAS and NumPy, so the test is skipped where they differ from
those recorded in the snapshot's metadata.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_behaviour.py"
SNAPSHOT = ROOT / "tests" / "fixtures" / "behaviour_cpu.npz"


def saved_metadata(path):
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["__metadata__"]))


def environment_differences(saved):
    """What differs between this environment and the one that saved the snapshot (empty when nothing)."""
    import llvmlite.binding as llvm
    import numba
    import scipy

    here = {
        "numba": numba.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "cpu_name": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
    }
    differences = [
        f"{key}: {here[key]!r} here, {saved.get(key)!r} saved" for key in here if here[key] != saved.get(key)
    ]
    # The check runs on the snapshot's thread count (large backward results depend on it).
    if saved.get("numba_threads", 1) > numba.config.NUMBA_NUM_THREADS:
        differences.append(
            f"numba threads: at most {numba.config.NUMBA_NUM_THREADS} here, {saved['numba_threads']} saved"
        )
    return differences


def run_check(args):
    # The repository's own package first on the path: the tree under test.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )


def test_cpu_results_are_bitwise_those_of_the_snapshot():
    differences = environment_differences(saved_metadata(SNAPSHOT))
    if differences:
        pytest.skip("the snapshot was saved in another environment (" + "; ".join(differences) + ")")
    result = run_check(["--check", str(SNAPSHOT)])
    output = result.stdout + result.stderr
    assert f"nblstm imported from {ROOT / 'nblstm'}" in output, output[-4000:]
    assert result.returncode == 0, output[-8000:]
