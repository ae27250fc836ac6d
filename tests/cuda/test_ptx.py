"""Compile-only checks of the CUDA target: no GPU, no driver, no simulator.

Every kernel of :mod:`nblstm.cuda` (:mod:`nblstm.cuda.registry`) is compiled to PTX with
``numba.cuda.compile_ptx`` for several compute capabilities, in every dtype
it runs in (float16 arrays only meet the storage-cast kernels: they are
computed in float32). This needs numba-cuda's NVVM (the ``cuda`` extra
brings it as wheels) but no GPU.

Compiling a kernel that calls a device function (here: the gate maths of
:mod:`nblstm.spec` and the step tiles) asks the current device for its
compute capability; without a GPU the test supplies it by patching
``numba.cuda.dispatcher.get_current_device``.
"""

import subprocess
import sys

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
nvrtc = pytest.importorskip("numba.cuda.cudadrv.nvrtc")
dispatcher = pytest.importorskip("numba.cuda.dispatcher")

from nblstm.cuda import catalog  # noqa: E402 - after the skips

# sm_70 (Volta) is listed for completeness: CUDA 13 toolkits dropped it, so
# it is skipped where the installed NVVM cannot target it.
CCS = [(7, 0), (7, 5), (8, 0), (9, 0)]


def _supported(cc):
    try:
        return cc in nvrtc.get_supported_ccs()
    except Exception:  # noqa: BLE001 - no NVRTC/NVVM: nothing compiles
        return False


class _Device:
    def __init__(self, cc):
        self.compute_capability = cc


@pytest.fixture
def target_cc(request, monkeypatch):
    cc = request.param
    if not _supported(cc):
        pytest.skip(f"the installed CUDA toolkit cannot target sm_{cc[0]}{cc[1]}")
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: _Device(cc))
    return cc


@pytest.mark.parametrize("target_cc", CCS, indirect=True, ids=[f"sm_{a}{b}" for a, b in CCS])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_every_kernel_compiles_to_ptx(dtype, target_cc):
    sigs = [*catalog.signatures(dtype, "common"), *catalog.signatures(dtype, "fused")]
    names = {name for name, _, _ in sigs}
    if dtype != np.float16:
        assert {"gemm", "forward_step", "forward_persistent", "backward_step", "backward_persistent",
                "forward_resident", "backward_resident", "fill_rows", "column_sums", "peephole_grads",
                "fill"} <= names
    for name, ptx in _compiled(sigs, dtype, target_cc):
        if "persistent" in name:
            assert "cudaCGGetIntrinsicHandle" in ptx or "grid" in ptx.lower(), f"{name}: no grid barrier"


def _compiled(sigs, dtype, target_cc):
    """``(name, ptx)`` of every kernel, each checked: the target, an entry point, and for float32 kernels no
    float64 arithmetic (a stray float64 literal would promote it)."""
    major, minor = target_cc
    for name, func, sig in sigs:
        ptx, _ = cuda.compile_ptx(func, sig, cc=target_cc)
        assert f".target sm_{major}{minor}" in ptx, name
        assert ".entry" in ptx, name
        if dtype == np.float32:
            assert ".f64" not in ptx, f"{name}: float64 arithmetic in a float32 kernel"
        yield name, ptx


@pytest.mark.parametrize("target_cc", CCS, indirect=True, ids=[f"sm_{a}{b}" for a, b in CCS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_every_cell_kernel_compiles_to_ptx(dtype, target_cc):
    """The LSTMCell kernels, the schedules' row moves and the layers' glue (float16 cells run them in float32)."""
    sigs = catalog.signatures(dtype, "cell")
    assert {"forward_step", "project_step", "backward_h_step", "backward_units_step", "cell_forward_resident",
            "cell_backward_resident", "masked_outputs", "write_state", "gather_rows", "scatter_add_rows", "swap01",
            "flip0", "place_columns", "take_columns", "add3", "mul3"} == {name for name, _, _ in sigs}
    for _ in _compiled(sigs, dtype, target_cc):  # every activation's maths included
        pass


def test_kernels_take_records_and_at_most_12_parameters():
    """Every kernel's parameters: at most 12, records typed as (named) tuples of their fields' kinds."""
    from numba import types

    from nblstm.cuda.fused_kernels import BackwardResults, ForwardOutputs
    from nblstm.options import KernelOptions

    sigs = {(name, len(sig)): sig for name, _, sig in catalog.signatures(np.float32)}
    assert all(count <= 12 for _, count in sigs), sorted(sigs)
    options = types.BaseTuple.from_types([types.float32, types.float32, types.boolean, types.float32, types.boolean,
                                          types.int64, types.boolean, types.boolean], KernelOptions)
    backward = sigs[("backward_step", 10)]
    assert backward[3] == types.NamedUniTuple(types.Array(types.float32, 3, "C"), 6, ForwardOutputs)
    assert backward[7] == options
    assert backward[8] == types.UniTuple(types.int64, 4)
    assert backward[9] == types.NamedTuple((types.Array(types.float32, 3, "C"), types.Array(types.float32, 2, "C")),
                                           BackwardResults)


def test_no_gpu_is_a_clear_runtime_error():
    """GPU-looking arrays in a process without a usable GPU raise RuntimeError, not a crash."""
    if cuda.is_available():
        pytest.skip("a GPU is usable here")
    import nblstm

    class FakeGPUArray:
        def __init__(self, shape):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False), "version": 3,
                                             "strides": None}

    args = [FakeGPUArray(s) for s in ((2, 1, 2), (1, 3), (1, 3), (5, 12), (12,))]
    with pytest.raises(RuntimeError, match="CUDA is not usable"):
        nblstm.block_lstm(*args)


def test_import_nblstm_does_not_import_numba_cuda():
    code = "import sys, nblstm, nblstm.ops, nblstm.raw_ops; print('numba.cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
