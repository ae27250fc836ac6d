"""The behaviour snapshot of the GPU path, in Numba's CUDA simulator.

``scripts/check_behaviour.py --cudasim --check tests/fixtures/behaviour_cudasim.npz``
runs a few very small cases through the public API with simulator arrays
(in a subprocess, which chooses the simulator itself) and compares every
result bitwise with the saved one. The simulator computes with NumPy on the
host, so the test is skipped where the CPU, numba, numba-cuda, SciPy or
NumPy differ from those recorded in the snapshot's metadata.
"""

import importlib.util

import pytest

from tests.test_behaviour import check_snapshot


def test_simulator_results_are_bitwise_those_of_the_snapshot():
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed")
    check_snapshot("behaviour_cudasim.npz", "--cudasim")
