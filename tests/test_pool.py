"""The pool of large output blocks (``nblstm.cpu.pool``): memory is reused only once no array or view uses it."""

import gc

import numpy as np
import pytest

import nblstm
from nblstm.cpu import pool as _pool


@pytest.fixture
def small_pool(monkeypatch):
    """Pool blocks from 1 KiB, and start from an empty pool."""
    monkeypatch.setattr(_pool, "MIN_BYTES", 1024)
    _pool.clear()
    yield
    _pool.clear()


def _address(a):
    return a.__array_interface__["data"][0]


def test_small_blocks_come_from_numpy_aligned():
    a = _pool.empty((10, 10), np.float32)
    assert a.flags.c_contiguous and a.dtype == np.float32 and a.ctypes.data % _pool.ALIGNMENT == 0


def test_a_freed_block_is_reused(small_pool):
    a = _pool.empty((7, 3, 64), np.float32)
    assert a.shape == (7, 3, 64) and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
    where = _address(a)
    del a
    gc.collect()
    b = _pool.empty((7, 3, 64), np.float32)
    assert _address(b) == where and where % _pool.ALIGNMENT == 0
    c = _pool.empty((7, 3, 64), np.float32)  # b is alive: fresh memory
    assert _address(c) != where


def test_a_view_keeps_its_block(small_pool):
    a = _pool.empty((4, 1024), np.float64)
    a[...] = 1.0
    rows = list(a)  # what the forward returns: views of one block
    where = _address(a)
    del a
    gc.collect()
    b = _pool.empty((4, 1024), np.float64)
    assert _address(b) != where, "memory still used by a view was lent again"
    b[...] = 2.0
    assert all((r == 1.0).all() for r in rows)
    del rows
    gc.collect()
    assert _address(_pool.empty((4, 1024), np.float64)) == where


def test_free_blocks_are_bounded(small_pool, monkeypatch):
    monkeypatch.setattr(_pool, "MAX_FREE_BYTES", 3 * 8192)
    blocks = [_pool.empty((1024,), np.float64) for _ in range(5)]
    assert all(isinstance(a.base, _pool._Lease) for a in blocks)
    del blocks
    gc.collect()
    assert sum(n for n, _ in _pool._free) <= 3 * 8192


def test_a_free_block_serves_requests_down_to_half_its_size(small_pool):
    a = _pool.empty((1000,), np.float64)
    where = _address(a)
    del a
    gc.collect()
    b = _pool.empty((600,), np.float64)  # 4.8 of 8 KB: the same block
    assert _address(b) == where and b.shape == (600,)
    b[...] = 1.0
    del b
    gc.collect()
    c = _pool.empty((400,), np.float64)  # under half: fresh memory, and the 8 KB block stays free
    assert _address(c) != where
    assert [n for n, _ in _pool._free] == [8000 + _pool.ALIGNMENT]


def test_a_request_no_block_serves_drops_the_smaller_ones(small_pool):
    """Calls whose sizes grow leave nothing behind: the free blocks smaller than a request that none of them
    serves are dropped (and their bytes no longer counted)."""
    blocks = [_pool.empty((n,), np.float64) for n in (200, 300, 5000)]
    del blocks
    gc.collect()
    assert sorted(n for n, _ in _pool._free) == [1600 + 64, 2400 + 64, 40000 + 64]
    grown = _pool.empty((1000,), np.float64)  # 8 KB: too large for the small ones, under half of the large one
    assert sorted(n for n, _ in _pool._free) == [40000 + 64]
    assert _pool._free_bytes == 40000 + 64
    del grown


def test_forward_outputs_from_the_pool_stay_intact(small_pool):
    """Two forwards in a row with pooled outputs: the first call's outputs are not overwritten by the second,
    and a third call after they are freed gives the same results in recycled memory."""
    rng = np.random.default_rng(0)
    t, b, i, h = 5, 3, 4, 8
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    w = (rng.standard_normal((i + h, 4 * h)) * 0.3).astype(np.float32)
    z = np.zeros((b, h), np.float32)
    bias = np.zeros(4 * h, np.float32)
    first = nblstm.block_lstm(x, z, z, w, bias)
    assert isinstance(first.h.base.base, _pool._Lease), "outputs not from the pool"
    kept = [a.copy() for a in first]
    second = nblstm.block_lstm(x * 2, z, z, w, bias)
    for a, k in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, k)
    assert not np.array_equal(second.h, first.h)
    where = _address(first.h)
    del first, a
    gc.collect()
    third = nblstm.block_lstm(x, z, z, w, bias)
    assert min(abs(_address(o) - where) for o in third) < 7 * t * b * h * 4, "freed block not reused"
    for a, k in zip(third, kept, strict=True):
        np.testing.assert_array_equal(a, k)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64])
@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (2, 3, 4), [2, 3], np.int64(5)])
def test_aligned_arrays(shape, dtype):
    arrays = [_pool.aligned(shape, dtype) for _ in range(8)]
    for k, a in enumerate(arrays):
        assert a.shape == np.empty(shape).shape and a.dtype == dtype, (a.shape, shape)
        assert a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or _address(a) % _pool.ALIGNMENT == 0
        a[...] = k
    for k, a in enumerate(arrays):  # each has memory of its own
        assert np.all(a == k)


def test_panels_and_outputs_are_aligned():
    """The micro-kernel's packed weights, and the arrays the gate maths runs over."""
    from nblstm.cpu import cell as cpu_cell
    from nblstm.cpu import pack, partition

    rng = np.random.default_rng(0)
    for units in (3, 5, 17):
        w = rng.standard_normal((units, 4 * units)).astype(np.float32)
        bounds = partition.chunk_bounds(1, units, 2)
        packed = pack.pack_recurrent(w, bounds, partition.column_offsets(bounds, 4, np.float32))
        assert _address(packed) % _pool.ALIGNMENT == 0
        weights = {"kernel": rng.standard_normal((2 + units, 4 * units)).astype(np.float32),
                   "bias": np.zeros(4 * units, np.float32)}
        cell_packed = cpu_cell.PackedWeights(weights, 2, 1)
        assert _address(cell_packed.w_rec) % _pool.ALIGNMENT == 0
        assert _address(cell_packed.w_rec_t) % _pool.ALIGNMENT == 0
    # The seven outputs are views of one block: each is aligned when B H is a multiple of 16 floats.
    x = rng.standard_normal((3, 2, 5)).astype(np.float32)
    out = nblstm.block_lstm(x, np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32),
                            rng.standard_normal((13, 32)).astype(np.float32), np.zeros(32, np.float32))
    assert all(_address(o) % _pool.ALIGNMENT == 0 for o in out)


def test_column_offsets_of_any_integer_bounds():
    from nblstm.cpu import microkernel, partition

    expected = partition.column_offsets(np.array([0, 5, 12, 16], np.int64), 4, np.float32)
    for dtype in (np.int32, np.uint16, np.int64):
        got = partition.column_offsets(np.array([0, 5, 12, 16], dtype), 4, np.float32)
        np.testing.assert_array_equal(got, expected)
    padded = [microkernel.padded(4 * n, np.float32) for n in (5, 7, 4)]  # 4 gates of 5, 7, 4 units
    assert expected.tolist() == [0, padded[0], padded[0] + padded[1], sum(padded)]
