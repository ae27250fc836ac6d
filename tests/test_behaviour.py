"""The behaviour snapshot: the package computes, bit for bit, what the commit that saved it computed.

``scripts/check_behaviour.py --check tests/fixtures/behaviour_cpu.npz`` runs
every case of the snapshot through the public API and compares each result
bitwise with the saved one. Bitwise results depend on the CPU (LLVM's code),
numba, SciPy's BLAS and NumPy, so the test is skipped where they differ from
those recorded in the snapshot's metadata (the script says so).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_behaviour.py"
SKIPPED = 77  # the script's exit status when the environment differs from the snapshot's


def check_snapshot(name, *options):
    """Run the script's check of ``tests/fixtures/<name>`` on this tree; skip where its environment differs."""
    # The repository's own package first on the path: the tree under test.
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *options, "--skip-other-environment", "--check",
         str(ROOT / "tests" / "fixtures" / name)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, timeout=1800,
    )
    output = result.stdout + result.stderr
    if result.returncode == SKIPPED:
        pytest.skip(output.strip().splitlines()[-1])
    assert f"nblstm imported from {ROOT / 'nblstm'}" in output, output[-4000:]
    assert result.returncode == 0, output[-8000:]


def test_cpu_results_are_bitwise_those_of_the_snapshot():
    check_snapshot("behaviour_cpu.npz")
