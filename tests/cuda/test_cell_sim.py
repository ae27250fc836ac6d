"""LSTMCell with GPU arrays: the CUDA kernels of nblstm.cuda.cell against the CPU path.

Runs in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) or on a GPU. The
simulator runs every thread as a Python thread, so shapes are tiny; its tiles
are tiny too (nblstm.cuda), so these shapes still span several tiles, partial
ones included. The GPU results are not bitwise those of the CPU (other
summation orders): they are compared with tolerances.
"""

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import _validate
from nblstm import cell as cell_module
from nblstm.cuda import cell as cuda_cell

# (rtol, atol) of the GPU against the CPU path, same inputs and compute dtype.
TOL = {np.float64: (1e-10, 1e-12), np.float32: (1e-5, 1e-5), np.float16: (2e-3, 2e-3)}


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def assert_gpu_array(a):
    assert not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host"), type(a)


def close(actual, expected, dtype, what):
    rtol, atol = TOL[np.dtype(dtype).type]
    assert_gpu_array(actual)
    actual = host(actual)
    assert actual.dtype == expected.dtype, what
    assert actual.shape == expected.shape, what
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def close_state(actual, expected, dtype, what):
    if isinstance(expected, tuple):
        assert isinstance(actual, nblstm.LSTMStateTuple), what
        close(actual.c, expected.c, dtype, f"{what}.c")
        close(actual.h, expected.h, dtype, f"{what}.h")
    else:
        close(actual, expected, dtype, what)


def to_gpu(state):
    if state is None:
        return None
    if isinstance(state, tuple):
        return type(state)(*(None if a is None else dev(a) for a in state))
    return dev(state)


def random_state(cell, rng, batch, dtype):
    zero = cell.zero_state(batch, dtype)
    if isinstance(zero, tuple):
        return nblstm.LSTMStateTuple(*(rng.standard_normal(a.shape).astype(dtype) for a in zero))
    return rng.standard_normal(zero.shape).astype(dtype)


def compare(cell, x, lengths, dtype, rng, initial_state=True, d_outputs=True, d_final="all"):
    """Forward and backward of ``cell`` on the CPU and on the GPU from the same inputs; every result compared."""
    batch = x.shape[1]
    state = random_state(cell, rng, batch, dtype) if initial_state else None
    (out, final), backward = cell.vjp(x, state, lengths)
    (g_out, g_final), g_backward = cell.vjp(dev(x), to_gpu(state), lengths)
    close(g_out, out, dtype, "outputs")
    close_state(g_final, final, dtype, "final_state")
    d_out = rng.standard_normal(out.shape).astype(dtype) if d_outputs else None
    d_state = random_state(cell, rng, batch, dtype)
    if d_final is None:
        d_state = None
    elif d_final == "h" and isinstance(d_state, tuple):
        d_state = nblstm.LSTMStateTuple(None, d_state.h)
    expected = backward(d_out, d_state)
    got = g_backward(None if d_out is None else dev(d_out), to_gpu(d_state))
    close(got[0], expected[0], dtype, "d_inputs")
    close_state(got[1], expected[1], dtype, "d_initial_state")
    assert list(got[2]) == list(expected[2]) == list(cell.weight_names)
    rtol, atol = TOL[np.dtype(dtype).type]
    for name, value in expected[2].items():
        assert isinstance(got[2][name], np.ndarray) and got[2][name].dtype == value.dtype, name
        np.testing.assert_allclose(got[2][name].astype(np.float64), value.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=f"d_weights[{name!r}]")
    return out, got


@pytest.fixture
def no_host_copies(monkeypatch):
    """Fail on any copy of a GPU argument to the host by nblstm.cell (the old path copied everything)."""

    def refuse(value):
        raise AssertionError("a GPU argument was copied to the host")

    monkeypatch.setattr(_validate, "to_host", refuse)


# (cell arguments, dtype, (T, B, I), lengths). Clip bounds small enough to clip
# some values of these inputs (checked in the test), lengths with 0 and T.
CASES = {
    "proj_peepholes_clips": (dict(num_units=3, num_proj=2, use_peepholes=True, cell_clip=0.4, proj_clip=0.15),
                             np.float64, (4, 3, 3), [4, 0, 2]),
    "joined_state_elu": (dict(num_units=3, use_peepholes=True, activation="elu", state_is_tuple=False,
                              forget_bias=0.5), np.float64, (3, 3, 2), [3, 1, 0]),
    "float32_proj_softsign": (dict(num_units=3, num_proj=2, activation="softsign", state_is_tuple=False,
                                   cell_clip=0.5), np.float32, (3, 2, 3), [3, 2]),
    "float32_plain": (dict(num_units=2), np.float32, (3, 3, 2), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sequence_matches_cpu(case, no_host_copies):
    kwargs, dtype, (steps, batch, inputs), lengths = CASES[case]
    rng = np.random.default_rng(len(case))
    cell = nblstm.LSTMCell(dtype=dtype, seed=3, **kwargs)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    lengths = None if lengths is None else np.array(lengths)
    compare(cell, x, lengths, dtype, rng)


def test_capped_grids_stride_over_their_work(monkeypatch, no_host_copies):
    """The cell's GEMMs and 1-D kernels with their grids capped (as past gridDim.y's limit on a GPU)."""
    from nblstm.cuda import launch

    monkeypatch.setattr(launch, "MAX_GRID_Y", 1)
    monkeypatch.setattr(launch, "LINEAR_MAX_BLOCKS", 1)
    kwargs, dtype, (steps, batch, inputs), lengths = CASES["proj_peepholes_clips"]
    rng = np.random.default_rng(7)
    cell = nblstm.LSTMCell(dtype=dtype, seed=3, **kwargs)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    compare(cell, x, np.array(lengths), dtype, rng)


def test_clips_are_active_in_the_clip_case():
    """The clip bounds of the clip case clip some values (so the zero-gradient branches are compared)."""
    from nblstm.cpu import cell as cpu_cell

    case = "proj_peepholes_clips"
    kwargs, dtype, (steps, batch, inputs), lengths = CASES[case]
    rng = np.random.default_rng(len(case))  # the draws of test_sequence_matches_cpu
    cell = nblstm.LSTMCell(dtype=dtype, seed=3, **kwargs)
    cell.build(inputs)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    state = random_state(cell, rng, batch, dtype)
    packed = cpu_cell.PackedWeights(cell.get_weights(), inputs, batch)
    saved = cpu_cell.sequence_forward(x, state.c, state.h, packed, np.array(lengths), cell._options())
    active = np.arange(steps)[:, None] < np.array(lengths)[None, :]
    assert (np.abs(saved["c_raw"][active]) > cell.cell_clip).any()
    assert (np.abs(saved["c_raw"][active]) < cell.cell_clip).any()
    assert (np.abs(saved["h_raw"][active]) > cell.proj_clip).any()
    assert (np.abs(saved["h_raw"][active]) < cell.proj_clip).any()


def test_every_activation_matches_cpu(no_host_copies):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 2, 2))
    for name in cell_module.ACTIVATION_NAMES:
        cell = nblstm.LSTMCell(2, activation=name, cell_clip=0.0 if name == "linear" else None, dtype=np.float64,
                               seed=1)
        compare(cell, x, np.array([2, 1]), np.float64, rng)


def test_missing_gradients_and_zero_state(no_host_copies):
    rng = np.random.default_rng(6)
    cell = nblstm.LSTMCell(3, num_proj=2, dtype=np.float64, seed=2)
    x = rng.standard_normal((3, 2, 2))
    compare(cell, x, np.array([1, 3]), np.float64, rng, initial_state=False, d_outputs=False, d_final="h")
    compare(cell, x, np.array([0, 0]), np.float64, rng, d_final=None)  # no step computes: the state passes


def test_float16(no_host_copies):
    rng = np.random.default_rng(7)
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, dtype=np.float16, seed=4)
    x = rng.standard_normal((3, 2, 2)).astype(np.float16)
    compare(cell, x, np.array([3, 2]), np.float16, rng)


@pytest.mark.parametrize("state_is_tuple", [True, False])
def test_one_step(state_is_tuple, no_host_copies):
    rng = np.random.default_rng(8)
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, cell_clip=0.5, state_is_tuple=state_is_tuple,
                           dtype=np.float32, seed=5)
    x = rng.standard_normal((3, 2)).astype(np.float32)
    state = random_state(cell, rng, 3, np.float32)
    output, new_state = cell(x, state)
    g_output, g_new_state = cell(dev(x), to_gpu(state))
    close(g_output, output, np.float32, "output")
    close_state(g_new_state, new_state, np.float32, "state")
    # The zero state of get_initial_state lives on the GPU too.
    g_output, _ = cell(dev(x), cell.get_initial_state(dev(x)))
    close(g_output, cell(x, cell.zero_state(3, np.float32))[0], np.float32, "output from zero state")


def test_backward_runs_again_and_keeps_the_forward_weights():
    """The saved forward values survive a backward pass, and set_weights after the forward does not change it."""
    rng = np.random.default_rng(9)
    cell = nblstm.LSTMCell(2, num_proj=2, dtype=np.float64, seed=6)
    x = rng.standard_normal((3, 2, 2))
    d_out = rng.standard_normal((3, 2, 2))
    (_, _), backward = cell.vjp(x)
    expected = backward(d_out)
    (_, _), g_backward = cell.vjp(dev(x))
    first = g_backward(dev(d_out))
    weights = cell.get_weights()
    cell.set_weights({k: a * 2 for k, a in weights.items()})
    second = g_backward(dev(d_out))
    for got in (first, second):
        np.testing.assert_allclose(host(got[0]), expected[0], rtol=1e-10, atol=1e-12)
        for name in expected[2]:
            np.testing.assert_allclose(got[2][name], expected[2][name], rtol=1e-10, atol=1e-12)


def test_weights_are_uploaded_once(monkeypatch):
    """Weights go to the GPU on the first call, stay there, and are uploaded again only after set_weights."""
    rng = np.random.default_rng(10)
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, dtype=np.float32, seed=7)
    x = rng.standard_normal((2, 2, 3)).astype(np.float32)
    # Every GPU argument is made before uploads are counted.
    d_x, d_grad = dev(x), dev(np.ones((2, 2, 2), np.float32))
    d_state = to_gpu(cell.zero_state(2, np.float32))
    uploads = []
    real = cuda.to_device

    def counting(value, *args, **kwargs):
        uploads.append(np.array(value, copy=True))
        return real(value, *args, **kwargs)

    monkeypatch.setattr(cuda, "to_device", counting)

    def weight_uploads():
        # The only other uploads are the int64 lengths.
        found = [a for a in uploads if a.dtype.kind == "f"]
        uploads.clear()
        return found

    out1 = host(cell.run(d_x)[0])
    (packed,) = weight_uploads()
    assert set(cell.get_weights()["kernel"].ravel()) <= set(packed.ravel())
    ((key, cached),) = cell._target_cache.items()
    assert isinstance(cached, cuda_cell.DeviceWeights)
    (_, _), backward = cell.vjp(d_x)
    backward(d_grad)
    out2 = host(cell(d_x[0], d_state)[0])
    assert weight_uploads() == []
    assert list(cell._target_cache) == [key] and cell._target_cache[key] is cached
    np.testing.assert_array_equal(out2, host(cell.run(d_x[:1])[0])[0])
    # New weights: the cache is dropped, the next call uploads them once.
    new = {k: a * 0.5 for k, a in cell.get_weights().items()}
    cell.set_weights(new)
    assert cell._target_cache == {}
    out3 = host(cell.run(d_x)[0])
    assert len(weight_uploads()) == 1
    assert cell._target_cache[key] is not cached
    np.testing.assert_allclose(out3, cell.run(x)[0], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out3, out1)
    host(cell.run(d_x)[0])
    assert weight_uploads() == []


def test_mixed_arguments_raise_before_any_kernel():
    cell = nblstm.LSTMCell(3, dtype=np.float32, seed=0)
    d_x = dev(np.ones((2, 2, 3), np.float32))
    with pytest.raises(TypeError, match="must live together"):
        cell.run(d_x, cell.zero_state(2, np.float32))
    (_, _), backward = cell.vjp(d_x)
    with pytest.raises(TypeError, match="must live where inputs did"):
        backward(np.ones((2, 2, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        backward(dev(np.ones((2, 2, 4), np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        backward(dev(np.ones((2, 2, 3), np.float64)))
    with pytest.raises(TypeError, match="dtype"):
        cell.run(dev(np.ones((2, 2, 3), np.float64)))
    bad_state = nblstm.LSTMStateTuple(dev(np.zeros((3, 3), np.float32)), dev(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match="shape"):
        cell.run(d_x, bad_state)
    with pytest.raises(ValueError, match="sequence_length"):
        cell.run(d_x, sequence_length=dev(np.array([1, 2, 2])))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_check_compares_the_cell_with_every_option(dtype):
    """``python -m nblstm check --target cuda`` compares the cell too (here on a tiny shape)."""
    from nblstm._tools import gpu_check as _gpu_check

    rows = _gpu_check._cell_rows(cuda, dtype, np.random.default_rng(0), shape=(3, 5, 2, 3), num_proj=2)
    names = {name for name, _, _ in rows}
    assert {"LSTMCell outputs", "LSTMCell d_inputs", "LSTMCell d_projection/kernel", "LSTMCell d_w_i_diag"} <= names
    assert max(rel for _, _, rel in rows) <= _gpu_check._REL_TOL[np.dtype(dtype)]
