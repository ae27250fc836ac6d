"""float16 <-> float32 conversions (nblstm.cpu.half) give NumPy's results bit for bit."""

import numpy as np
import pytest

from nblstm.cpu import half as _half


def test_every_float16_converts_exactly_to_float32():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    got = _half.to_float32(halves)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), halves.astype(np.float32).view(np.uint32))


def _float32_cases():
    """A sweep of all float32 bit patterns plus, around every float16, the neighbours and rounding ties."""
    sweep = np.arange(0, 1 << 32, 4099, dtype=np.uint64)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    near = [(halves.astype(np.int64) + d) % (1 << 32)
            for d in (0, 1, -1, 1 << 12, -(1 << 12), (1 << 12) + 1, (1 << 12) - 1, -(1 << 12) - 1)]
    return np.concatenate([sweep, *near]).astype(np.uint32).view(np.float32)


def test_float32_rounds_to_float16_like_numpy():
    values = _float32_cases()  # includes +-0, subnormals, ties, overflow, inf and NaN payloads
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    got = _half.to_float16(values)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (5,), (70000,), (3, 4, 5)])
def test_shapes_layouts_and_no_change_to_the_argument(shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 100).astype(np.float32)
    strided = np.asfortranarray(a) if a.ndim > 1 else a[::-1]
    before = strided.copy()
    h = _half.to_float16(strided)
    assert h.shape == strided.shape and h.flags.c_contiguous
    np.testing.assert_array_equal(h, strided.astype(np.float16))
    back = _half.to_float32(h[..., ::-1] if h.ndim else h)
    np.testing.assert_array_equal(back, (h[..., ::-1] if h.ndim else h).astype(np.float32))
    np.testing.assert_array_equal(strided, before)
