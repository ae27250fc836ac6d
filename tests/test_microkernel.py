"""The register-tiled micro-kernel of the recurrent step (``nblstm.cpu.microkernel``), against NumPy in float64.

The fused ops' tests cover it through the kernels; these check the GEMM
itself on every kind of edge: row tails (``rows`` not a multiple of the
tile), zero-padded column tails, offsets into larger arrays, ``K = 1``, and
that nothing outside the result block is written. The tile shape of other
CPUs (AVX2: 4 x 3 vectors) is built and checked here too, whatever this
machine has.
"""

import numpy as np
import pytest
from numba import njit

from nblstm.cpu import microkernel as mk

SHAPES = [(1, 1, 1), (2, 3, 5), (3, 17, 40), (8, 16, 32), (9, 33, 33), (13, 7, 94), (32, 64, 100)]


# The micro-kernel's functions have no Python entry point (only kernels call them): called through these.
@njit
def gemm_panels(a, a_off, lda, rows, bp, bp_off, k, panels, c, c_off, ldc, accumulate=False):
    mk.gemm_panels(a, a_off, lda, rows, bp, bp_off, k, panels, c, c_off, ldc, accumulate)


@njit
def pack_columns(src, col0, n, dst, dst_off, j0, width):
    mk.pack_columns(src, col0, n, dst, dst_off, j0, width)


@njit
def pack_rows(src, row0, n, dst, dst_off, j0, width):
    mk.pack_rows(src, row0, n, dst, dst_off, j0, width)


@njit
def zero_columns(dst, dst_off, depth, j0, width):
    mk.zero_columns(dst, dst_off, depth, j0, width)


def _pack(b, width, offset):
    """``b: [K, N]`` packed in panels of ``width`` columns from ``offset`` of a NaN-filled array."""
    k, n = b.shape
    panels = -(-n // width)
    dst = np.full(offset + panels * k * width + 3, np.nan, b.dtype)
    pack_columns(np.ascontiguousarray(b), 0, n, dst, offset, 0, width)
    zero_columns(dst, offset, k, n, width)
    return dst, panels


def _panels_reference(m, width):
    """``m: [K, N]`` in panels of ``width`` columns, zero-padded, by NumPy."""
    k, n = m.shape
    panels = -(-n // width)
    padded = np.zeros((k, panels * width), m.dtype)
    padded[:, :n] = m
    return padded.reshape(k, panels, width).transpose(1, 0, 2).reshape(-1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pack_columns_and_rows_match_numpy(dtype):
    """Runs of columns (or of rows, transposed) at unaligned panel positions, padded with zeros;
    nothing written outside the panels."""
    rng = np.random.default_rng(3)
    width = mk.panel_width(dtype)
    offset = 5
    src = rng.standard_normal((70, 150)).astype(dtype)
    runs = [(3, 0, 7), (20, 7, width + 3), (140, 10 + width, 5)]  # (source start, j0, n)
    cols = 15 + width
    panels = -(-cols // width)

    dst = np.full(offset + panels * 70 * width + 3, np.nan, dtype)
    for start, j0, n in runs:
        pack_columns(src, start, n, dst, offset, j0, width)
    zero_columns(dst, offset, 70, cols, width)
    expected = _panels_reference(np.concatenate([src[:, s:s + n] for s, _, n in runs], axis=1), width)
    np.testing.assert_array_equal(dst[offset:-3], expected)
    assert np.isnan(dst[:offset]).all() and np.isnan(dst[-3:]).all()

    dst = np.full(offset + panels * 150 * width + 3, np.nan, dtype)
    rows = [(0, 0, 7), (30, 7, width + 3), (65, 10 + width, 5)]
    for start, j0, n in rows:
        pack_rows(src, start, n, dst, offset, j0, width)
    zero_columns(dst, offset, 150, cols, width)
    expected = _panels_reference(np.concatenate([src[s:s + n] for s, _, n in rows]).T, width)
    np.testing.assert_array_equal(dst[offset:-3], expected)
    assert np.isnan(dst[:offset]).all() and np.isnan(dst[-3:]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gemm_panels_matches_numpy(shape, dtype):
    rows, k, n = shape
    rng = np.random.default_rng(rows * 1000 + k)
    width = mk.panel_width(dtype)
    a = rng.standard_normal((rows + 2, k + 3)).astype(dtype)  # a block inside a larger array
    b = rng.standard_normal((k, n)).astype(dtype)
    bp, panels = _pack(b, width, offset=5)
    assert np.isnan(bp[:5]).all() and np.isnan(bp[-3:]).all(), "packing wrote outside its panels"
    ldc = panels * width + 4
    c = np.full((rows + 1, ldc), np.nan, dtype)
    gemm_panels(a.reshape(-1), a.shape[1] + 1, a.shape[1], rows, bp, 5, k, panels, c.reshape(-1), ldc, ldc)
    expected = a[1:rows + 1, 1:k + 1].astype(np.float64) @ b.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(c[1:, :n], expected, rtol=tol, atol=tol * np.sqrt(k))
    assert (c[1:, n:panels * width] == 0).all(), "padded columns must come out zero"
    assert np.isnan(c[0]).all() and np.isnan(c[1:, panels * width:]).all(), "wrote outside the result block"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_panels_accumulate_continues_each_accumulator(dtype):
    """``C = A1 @ B1`` then ``C += A2 @ B2``: the bits of one product over the joined K."""
    rng = np.random.default_rng(9)
    width = mk.panel_width(dtype)
    rows, k1, k2 = 11, 13, 29
    a = rng.standard_normal((rows, k1 + k2)).astype(dtype)
    b = rng.standard_normal((k1 + k2, 2 * width)).astype(dtype)
    joined, panels = _pack(b, width, offset=0)
    first, _ = _pack(b[:k1], width, offset=0)
    second, _ = _pack(b[k1:], width, offset=0)
    a1, a2 = np.ascontiguousarray(a[:, :k1]), np.ascontiguousarray(a[:, k1:])
    ldc = panels * width
    whole = np.empty((rows, ldc), dtype)
    gemm_panels(a.reshape(-1), 0, k1 + k2, rows, joined, 0, k1 + k2, panels, whole.reshape(-1), 0, ldc)
    parts = np.empty((rows, ldc), dtype)
    gemm_panels(a1.reshape(-1), 0, k1, rows, first, 0, k1, panels, parts.reshape(-1), 0, ldc)
    gemm_panels(a2.reshape(-1), 0, k2, rows, second, 0, k2, panels, parts.reshape(-1), 0, ldc, True)
    np.testing.assert_array_equal(parts, whole)


@pytest.mark.parametrize("accumulate", [False, True])
def test_results_do_not_depend_on_the_row_tiling(accumulate):
    """Each element is one accumulator over k in order: a row gives the same bits alone (panels
    in pairs, then the odd one) or in a tile, whole or of half or a quarter of the tile's rows (the
    rows after the last whole tile), whatever the number of rows."""
    rng = np.random.default_rng(7)
    width = mk.panel_width(np.float32)
    most = 2 * mk.TILE_ROWS + 3
    a = rng.standard_normal((most, 300)).astype(np.float32)
    b = rng.standard_normal((300, 3 * width)).astype(np.float32)
    start = rng.standard_normal((most, 3 * width)).astype(np.float32)
    bp, panels = _pack(b, width, offset=0)
    alone = start.copy()
    for r in range(most):
        gemm_panels(a[r], 0, 300, 1, bp, 0, 300, panels, alone[r], 0, panels * width, accumulate)
    for rows in range(1, most + 1):
        together = np.full((most, panels * width), np.nan, np.float32)
        together[:rows] = start[:rows]
        gemm_panels(a.reshape(-1), 0, 300, rows, bp, 0, 300, panels, together.reshape(-1), 0, panels * width,
                       accumulate)
        np.testing.assert_array_equal(together[:rows], alone[:rows], err_msg=f"{rows} rows")
        assert np.isnan(together[rows:]).all(), f"{rows} rows: wrote past the last row"


@pytest.mark.parametrize("tile", [(8, 4, 3), (16, 8, 2), (4, 3, 1)], ids=str)
def test_other_tile_shapes(tile):
    lanes32, tile_rows, vectors = tile
    kernel = mk.make_tile(lanes32, tile_rows, vectors)

    @njit
    def gemm(a, lda, rows, bp, k, panels, width, c, ldc):
        for q in range(panels):
            for r0 in range(0, rows, tile_rows):
                kernel(c, r0 * ldc + q * width, ldc, a, r0 * lda, lda, bp, q * k * width, k, min(tile_rows, rows - r0))

    for dtype in (np.float32, np.float64):
        width = vectors * (lanes32 if dtype == np.float32 else lanes32 // 2)
        rng = np.random.default_rng(tile_rows)
        rows, k, n = 2 * tile_rows + 1, 21, 2 * width + 1
        a = rng.standard_normal((rows, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        bp, panels = _pack(b, width, offset=0)
        c = np.full((rows, panels * width), np.nan, dtype)
        gemm(a.reshape(-1), k, rows, bp, k, panels, width, c.reshape(-1), panels * width)
        tol = 1e-5 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(c[:, :n], a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("accumulate", [False, True])
def test_tile_of_several_panels(accumulate):
    """A tile over 3 consecutive panels: C[:, 0:3P] = A @ [Bp_0 Bp_1 Bp_2] (+ C)."""
    kernel = mk.make_tile(16, 2, 2, accumulate=accumulate, panels=3)

    @njit
    def run(c, ldc, a, lda, bp, k, rows):
        kernel(c, 0, ldc, a, 0, lda, bp, 0, k, rows)

    for dtype in (np.float32, np.float64):
        width = 2 * (16 if dtype == np.float32 else 8)
        rng = np.random.default_rng(5)
        a = rng.standard_normal((2, 19)).astype(dtype)
        b = rng.standard_normal((19, 3 * width)).astype(dtype)
        bp, _ = _pack(b, width, offset=0)
        c0 = rng.standard_normal((2, 3 * width + 1)).astype(dtype)
        c = c0.copy()
        run(c.reshape(-1), 3 * width + 1, a.reshape(-1), 19, bp, 19, 2)
        expected = a.astype(np.float64) @ b + (c0[:, :-1] if accumulate else 0)
        tol = 1e-5 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(c[:, :-1], expected, rtol=tol, atol=tol)
        assert (c[:, -1] == c0[:, -1]).all()


def test_padded_rounds_up_to_the_panel_width():
    for dtype in (np.float32, np.float64):
        p = mk.panel_width(dtype)
        assert [mk.padded(n, dtype) for n in (1, p, p + 1)] == [p, p, 2 * p]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_transpose_gates_moves_the_bits_of_each_gate_block(dtype):
    from nblstm.cpu.pack import transpose_gates

    rng = np.random.default_rng(3)
    blocks = (0, 2, 1, 3)
    # Whole tiles (16 float32, 32 float16, 8 float64 a side) and the edges past them.
    for units, width in [(1, 1), (3, 5), (17, 33), (16, 48), (0, 4), (5, 0), (32, 64), (33, 70)]:
        rows = rng.standard_normal((4 * units, width)).astype(dtype)
        rows.flat[:1] = -0.0
        expected = np.empty((width, 4 * units), dtype)
        for k, g in enumerate(blocks):
            expected[:, g * units:(g + 1) * units] = rows[k * units:(k + 1) * units].T
        big = np.full((width + 2, 4 * units), 7, dtype)  # rows of a larger array: a C-contiguous slice
        columns = big[1:-1]
        transpose_gates([(rows, columns)], blocks, True)
        bits = f"u{rows.itemsize}"
        np.testing.assert_array_equal(columns.view(bits), expected.view(bits))
        assert (big[0] == 7).all() and (big[-1] == 7).all()  # nothing written outside
        back = np.full_like(rows, np.nan)
        transpose_gates([(back, columns)], blocks, False)
        np.testing.assert_array_equal(back.view(bits), rows.view(bits))
    with pytest.raises(ValueError, match="expected"):
        transpose_gates([(np.zeros((8, 3), dtype), np.zeros((8, 3), dtype))], blocks, True)
    with pytest.raises(ValueError, match="expected"):
        transpose_gates([(np.zeros((8, 3), dtype), np.zeros((3, 8), np.int8))], blocks, True)
    with pytest.raises(ValueError, match="permutation"):
        transpose_gates([(np.zeros((8, 3), dtype), np.zeros((3, 8), dtype))], (0, 1, 1, 3), True)
    with pytest.raises(ValueError, match="expected"):
        transpose_gates([(np.zeros(8, dtype), np.zeros((3, 8), dtype))], blocks, True)
    with pytest.raises(ValueError, match="C-contiguous"):
        transpose_gates([(np.zeros((8, 6), dtype)[:, ::2], np.zeros((3, 8), dtype))], blocks, True)
    # Two pairs at once, one a thread, each with its own shape.
    first = rng.standard_normal((4 * 300, 200)).astype(dtype)
    second = rng.standard_normal((4 * 300, 100)).astype(dtype)
    out_first, out_second = np.empty((200, 4 * 300), dtype), np.empty((100, 4 * 300), dtype)
    transpose_gates([(first, out_first), (second, out_second)], blocks, True)
    for rows, columns in ((first, out_first), (second, out_second)):
        alone = np.empty_like(columns)
        transpose_gates([(rows, alone)], blocks, True)
        np.testing.assert_array_equal(columns.view(f"u{rows.itemsize}"), alone.view(f"u{rows.itemsize}"))
    with pytest.raises(ValueError, match="one or two"):
        transpose_gates([(first, out_first)] * 3, blocks, True)
    with pytest.raises(ValueError, match="item size"):
        other = np.float32 if dtype == np.float64 else np.float64
        transpose_gates([(first, out_first), (second.astype(other), out_second.astype(other))], blocks, True)


def test_nblstm_info_names_the_tile_chosen_for_this_cpu():
    import io

    from nblstm._tools import cli

    out = io.StringIO()
    assert cli.info(None, out) == 0
    line = next(x for x in out.getvalue().splitlines() if x.startswith("microkernel"))
    assert f"{mk.TILE_ROWS} x " in line and f"panels of {mk.panel_width(np.float32)} float32" in line
