"""The kernels' views and runs of elements (nblstm.cpu.views) against NumPy's slices."""

import numpy as np
import pytest
from numba import njit

from nblstm.cpu.views import copy_elements, fill_zero, flat, matrix


@njit
def _fill(a, start, count):
    fill_zero(flat(a), start, count)


@njit
def _copy(dst, dst_start, src, src_start, count):
    copy_elements(flat(dst), dst_start, flat(src), src_start, count)


@njit
def _copy_within(a, dst_start, src_start, count):
    f = flat(a)
    copy_elements(f, dst_start, f, src_start, count)


@njit
def _matrix(a, start, rows, cols):
    return matrix(flat(a), start, rows, cols)


@njit
def _matrix_add_one(a, start, rows, cols):
    m = matrix(a, start, rows, cols)
    for r in range(rows):
        for c in range(cols):
            m[r, c] += 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize(("start", "rows", "cols"), [(0, 3, 5), (7, 2, 4), (40, 1, 5), (3, 0, 4), (45, 0, 0)])
def test_matrix_is_a_reshaped_run_of_elements(dtype, start, rows, cols):
    a = np.arange(45, dtype=dtype).reshape(5, 9)
    view = _matrix(a, np.int64(start), np.int64(rows), np.uint64(cols))
    expected = a.reshape(-1)[start:start + rows * cols].reshape(rows, cols)
    assert view.shape == expected.shape and view.flags.c_contiguous
    np.testing.assert_array_equal(view, expected)
    if view.size:  # an empty array's strides are free
        assert view.strides == expected.strides and np.shares_memory(view, a)


def test_matrix_writes_through_and_keeps_its_owner_alive():
    a = np.zeros(20, np.float32)
    _matrix_add_one(a, 6, 3, 4)
    expected = np.zeros(20, np.float32)
    expected[6:18] = 1
    np.testing.assert_array_equal(a, expected)
    view = _matrix(np.arange(12, dtype=np.float64), 2, 2, 5)  # the only reference to its memory
    np.testing.assert_array_equal(view, np.arange(2, 12, dtype=np.float64).reshape(2, 5))


def test_matrix_of_a_read_only_array_is_read_only():
    from numba.core.errors import TypingError

    read_only = np.arange(8.0)
    read_only.flags.writeable = False
    np.testing.assert_array_equal(_matrix(read_only, 2, 3, 2), np.arange(2.0, 8.0).reshape(3, 2))
    with pytest.raises(TypingError):
        _matrix_add_one(read_only, 0, 2, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize(("start", "count"), [(0, 0), (0, 1), (3, 17), (5, 40), (0, 45)])
def test_fill_zero_is_a_slice_set_to_positive_zero(dtype, start, count):
    a = np.full((5, 9), -1, dtype)
    expected = a.copy().reshape(-1)
    expected[start:start + count] = 0
    _fill(a, np.uint64(start), np.int64(count))
    assert a.reshape(-1).tobytes() == expected.tobytes()  # +0.0 (no sign bit), the rest untouched


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_copy_elements_copies_a_run_and_nothing_else(dtype):
    rng = np.random.default_rng(0)
    src = rng.standard_normal((4, 6)).astype(dtype)
    src[1, 2] = np.frombuffer(np.array([0x7FF0000000000001 if dtype == np.float64 else 0x7F800001],
                                       np.uint64 if dtype == np.float64 else np.uint32).tobytes(), dtype)[0]
    src[2, 0] = -0.0
    dst = np.full((3, 7), 5, dtype)
    expected = dst.copy().reshape(-1)
    expected[4:4 + 13] = src.reshape(-1)[7:7 + 13]
    _copy(dst, np.uint64(4), src, np.int64(7), np.uint64(13))
    assert dst.reshape(-1).tobytes() == expected.tobytes()  # NaN payloads and signed zeros as bits


@pytest.mark.parametrize(("dst_start", "src_start"), [(2, 0), (0, 2), (3, 3)])
def test_copy_elements_within_one_array_as_memmove(dst_start, src_start):
    """Overlapping runs come out as if copied through a buffer."""
    a = np.arange(12, dtype=np.float32)
    expected = a.copy()
    expected[dst_start:dst_start + 8] = a[src_start:src_start + 8].copy()
    _copy_within(a, dst_start, src_start, 8)
    np.testing.assert_array_equal(a, expected)


def test_views_refuse_other_layouts_and_dtypes():
    from numba.core.errors import TypingError

    with pytest.raises(TypingError):
        _copy(np.zeros(4, np.float32), 0, np.zeros(4, np.float64), 0, 1)

    @njit
    def fill_strided(a):
        fill_zero(a[::2], 0, 1)

    with pytest.raises(TypingError):
        fill_strided(np.ones(4))

    @njit
    def matrix_of_strided(a):
        return matrix(a[::2], 0, 1, 1)

    with pytest.raises(TypingError):
        matrix_of_strided(np.ones(4))
    with pytest.raises(TypingError):
        _matrix_add_one(np.ones((2, 2)), 0, 1, 1)  # not flat

    read_only = np.ones(4)
    read_only.flags.writeable = False
    with pytest.raises(TypingError):
        _fill(read_only, 0, 1)
    with pytest.raises(TypingError):
        _copy(read_only, 0, np.zeros(4), 0, 1)
