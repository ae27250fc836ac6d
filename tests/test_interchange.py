"""Arrays of other libraries at the public boundary (nblstm.interchange): DLPack in, the same library out.

A small array library defined here (``dlpackarray``: a NumPy array behind
``__dlpack__``, with a module-level ``from_dlpack``) stands for PyTorch and
JAX CPU arrays, which CI does not install; the same calls run on real
PyTorch tensors where PyTorch is installed.
"""

import sys
import types

import numpy as np
import pytest

import nblstm
from nblstm.interchange import accepts_any_array, foreign_array

fake = types.ModuleType("dlpackarray")


class Array:
    """A host array of another library: it speaks DLPack only."""

    def __init__(self, data):
        self._data = np.asarray(data)

    def __dlpack__(self, **kwargs):
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    @property
    def shape(self):
        return self._data.shape


Array.__module__ = "dlpackarray"
fake.Array = Array
fake.from_dlpack = lambda a: Array(np.from_dlpack(a))


@pytest.fixture(autouse=True)
def _library():
    sys.modules["dlpackarray"] = fake
    yield
    sys.modules.pop("dlpackarray", None)


def data(a):
    assert isinstance(a, Array), type(a)
    return a._data


def test_recognises_foreign_arrays_only():
    assert foreign_array(Array(np.ones(2)))
    assert not foreign_array(np.ones(2))
    assert not foreign_array(None)
    assert not foreign_array([1, 2])


def test_numpy_calls_pass_through_unchanged():
    seen = []

    @accepts_any_array
    def f(a, b=None):
        seen.append((a, b))
        return a

    x = np.ones(3)
    assert f(x, b=x) is x and seen[0][0] is x


def test_block_lstm_in_and_out_of_another_library():
    rng = np.random.default_rng(0)
    T, B, I, H = 4, 2, 3, 5
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((T, B, I), (B, H), (B, H), (I + H, 4 * H))]
    b = np.zeros(4 * H, np.float32)
    expected = nblstm.block_lstm(*arrays, b)
    got = nblstm.block_lstm(*(Array(a) for a in arrays), Array(b))
    assert type(got) is type(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(data(g), e)
    grads = nblstm.block_lstm_grad(*(Array(a) for a in arrays), got, h_grad=Array(np.ones((T, B, H), np.float32)))
    expected_grads = nblstm.block_lstm_grad(*arrays, expected, h_grad=np.ones((T, B, H), np.float32))
    np.testing.assert_array_equal(data(grads.w_grad), expected_grads.w_grad)


def test_inputs_are_read_without_a_copy():
    x = np.ones((3, 2, 4), np.float32)
    seen = []

    @accepts_any_array
    def f(a):
        seen.append(a)
        return a

    f(Array(x))
    assert np.shares_memory(seen[0], x)


def test_cell_and_layer_return_the_callers_kind():
    x = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32)
    cell = nblstm.LSTMCell(4, num_proj=2, seed=0)
    outputs, state = cell.run(Array(x), sequence_length=Array(np.array([5, 2])))
    expected, expected_state = cell.run(x, sequence_length=[5, 2])
    np.testing.assert_array_equal(data(outputs), expected)
    np.testing.assert_array_equal(data(state.c), expected_state.c)
    (outputs, state), backward = cell.vjp(Array(x))
    d_x, d_state, d_w = backward(Array(np.ones((5, 2, 2), np.float32)))
    assert isinstance(d_x, Array) and isinstance(d_w["kernel"], Array) and isinstance(d_state.h, Array)
    lstm = nblstm.LSTM(3, 4, num_layers=2, bidirectional=True, seed=0)
    out, (h_n, c_n) = lstm(Array(x), (Array(np.zeros((4, 2, 4), np.float32)), None))
    np.testing.assert_array_equal(data(out), lstm(x)[0])
    assert isinstance(h_n, Array)


def test_weights_of_another_library():
    cell = nblstm.LSTMCell(2, dtype=np.float32)
    cell.set_weights({"kernel": Array(np.zeros((5, 8), np.float32)), "bias": Array(np.ones(8, np.float32))})
    assert cell.input_depth == 3 and float(cell.get_weights()["bias"].sum()) == 8.0


def test_a_gpu_dlpack_array_without_cuda_array_interface_is_refused():
    class OnGpu(Array):
        def __dlpack_device__(self):
            return (2, 0)

    OnGpu.__module__ = "dlpackarray"
    with pytest.raises(TypeError, match="DLPack device type 2"):
        nblstm.LSTMCell(2, seed=0).run(OnGpu(np.ones((2, 1, 3), np.float32)))


def test_pytorch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 2, 3)
    lstm = nblstm.LSTM(3, 5, bidirectional=True, seed=0)
    out, (h_n, c_n) = lstm(x, sequence_length=torch.tensor([4, 2]))
    assert isinstance(out, torch.Tensor) and isinstance(h_n, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), lstm(x.numpy(), sequence_length=[4, 2])[0])
    with pytest.raises(TypeError, match="requires grad"):
        lstm(x.requires_grad_(True))
