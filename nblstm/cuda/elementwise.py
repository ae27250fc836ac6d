"""Kernels without shared memory: fills, copies with a cast, column reductions, the cell's output masks and rows.

Grid-stride loops over their elements, launched by
:meth:`nblstm.cuda.launch.Launcher.elementwise`; generic, specialised lazily
on their argument types. Each output element is written by one thread and
reductions run in a fixed order: deterministic.
"""

from numba import cuda

from .registry import A1, A2, A3, ANY1, ANY2, ANY3, I64, INDEX, LENGTHS, SCALAR, kernel

__all__ = ["column_sums", "copy1", "copy2", "copy3", "fill", "fill2", "fill_rows", "gather_rows", "masked_outputs",
           "peephole_grads", "peephole_products", "scatter_add_rows", "write_state"]


@kernel("common", storage=True)
def fill(out: A1, value: SCALAR):
    """``out[:] = value``; ``out: [N]`` C-contiguous."""
    for k in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[k] = value


@kernel("common")
def fill2(out: ANY2, value: SCALAR):
    """``out[:, :] = value``; ``out: [N0, N1]``, any strides (e.g. the tails of several outputs)."""
    n1 = out.shape[1]
    for k in range(cuda.grid(1), out.shape[0] * n1, cuda.gridsize(1)):
        out[k // n1, k % n1] = value


@kernel("common")
def fill_rows(out: A2, row: A1):
    """``out[m, :] = row`` for every ``m``; ``out: [M, N]`` C-contiguous, ``row: [N]`` (a bias, before cuBLAS adds
    the product to it)."""
    n = out.shape[1]
    for k in range(cuda.grid(1), out.shape[0] * n, cuda.gridsize(1)):
        out[k // n, k % n] = row[k % n]


@kernel("common", storage=True)
def copy1(src: ANY1, dst: A1):
    """``dst[:] = src`` with a cast; ``src, dst: [N]``, any strides."""
    for k in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[k] = src[k]


@kernel("common", storage=True)
def copy2(src: ANY2, dst: A2):
    """``dst[:, :] = src`` with a cast; ``src, dst: [N0, N1]``, any strides."""
    n1 = dst.shape[1]
    for k in range(cuda.grid(1), dst.shape[0] * n1, cuda.gridsize(1)):
        dst[k // n1, k % n1] = src[k // n1, k % n1]


@kernel("common", storage=True)
def copy3(src: ANY3, dst: A3):
    """``dst[:, :, :] = src`` with a cast; ``src, dst: [N0, N1, N2]``, any strides."""
    n1 = dst.shape[1]
    n2 = dst.shape[2]
    for k in range(cuda.grid(1), dst.shape[0] * n1 * n2, cuda.gridsize(1)):
        a = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[a, r // n2, r % n2] = src[a, r // n2, r % n2]


@kernel("common")
def column_sums(m: A2, out: A1, zero: SCALAR):
    """``out[n] = sum_r m[r, n]``; ``m: [R, N]``, ``out: [N]``, ``zero`` of their dtype.

    One thread per column, rows summed in order: deterministic, and the
    reads of a warp are coalesced along the row.
    """
    for n in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        s = zero
        for r in range(m.shape[0]):
            s += m[r, n]
        out[n] = s


@kernel("fused")
def peephole_grads(steps: I64, cs_prev: A2, cs_: A3, dgates: A3, bi: I64, bf: I64, bo: I64, zero: SCALAR, wci_grad: A1,
                   wcf_grad: A1, wco_grad: A1):
    """Peephole weight gradients summed over steps and batch.

    Parameters
    ----------
    steps : int
        ``S``, the number of steps computed.
    cs_prev : [B, H] array
    cs_ : [T, B, H] array, T >= S
        Forward cell states.
    dgates : [S, B, 4H] array
        Gradients of the gate pre-activations, caller's layout.
    bi, bf, bo : int
        Gate block index of i, f and o in the layout.
    zero : scalar of the compute dtype
    wci_grad, wcf_grad, wco_grad : [H] arrays
        Outputs: ``sum di * c_prev``, ``sum df * c_prev``, ``sum do * cs``.
    """
    batch, units = cs_prev.shape
    for j in range(cuda.grid(1), units, cuda.gridsize(1)):
        si = zero
        sf = zero
        so = zero
        for t in range(steps):
            for b in range(batch):
                c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
                si += dgates[t, b, bi * units + j] * c_prev
                sf += dgates[t, b, bf * units + j] * c_prev
                so += dgates[t, b, bo * units + j] * cs_[t, b, j]
        wci_grad[j] = si
        wcf_grad[j] = sf
        wco_grad[j] = so


@kernel("fused")
def peephole_products(steps: I64, cs_prev: A2, cs_: A3, dgates: A3, bi: I64, bf: I64, bo: I64, out: A2):
    """The terms of the peephole gradients, ``out[t B + b] = [di c_prev, df c_prev, do cs]`` (``out: [S B, 3H]``).

    Their column sums are the gradients (:func:`peephole_grads` sums them in
    one thread per unit; with cuBLAS a product with ones does, in parallel).
    """
    batch, units = cs_prev.shape
    for e in range(cuda.grid(1), steps * batch * units, cuda.gridsize(1)):
        row = e // units
        j = e % units
        t = row // batch
        b = row % batch
        c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
        out[row, j] = dgates[t, b, bi * units + j] * c_prev
        out[row, units + j] = dgates[t, b, bf * units + j] * c_prev
        out[row, 2 * units + j] = dgates[t, b, bo * units + j] * cs_[t, b, j]


@kernel("cell")
def masked_outputs(lengths: LENGTHS, h_: A3, out: A3, zero: SCALAR):
    """``out[t, b] = h_[t, b]`` for ``t < lengths[b]``, zero elsewhere.

    Parameters
    ----------
    lengths : [B] int64 array
    h_ : [S, B, P] array
        Output state of the steps computed (``S = max(lengths)``).
    out : [T, B, P] array
    zero : scalar of the dtype of ``out``
    """
    steps, batch, depth = out.shape
    per_step = batch * depth
    for k in range(cuda.grid(1), steps * per_step, cuda.gridsize(1)):
        t = k // per_step
        rest = k % per_step
        b = rest // depth
        p = rest % depth
        if t < lengths[b]:
            out[t, b, p] = h_[t, b, p]
        else:
            out[t, b, p] = zero


@kernel("cell")
def write_state(c: A2, h: A2, out: A1, c_offset: I64, c_row: I64, h_offset: I64, h_row: I64):
    """Copy a state into a flat results array: ``c[b, j]`` to ``out[c_offset + b c_row + j]``, ``h`` likewise.

    Two regions for a state tuple (``c_row = H``, ``h_row = P``); one
    ``[B, H + P]`` array for a joined state (``c_row = h_row = H + P``,
    ``h_offset = c_offset + H``).

    Parameters
    ----------
    c : [B, H] array
    h : [B, P] array
    out : [N] array
    c_offset, c_row, h_offset, h_row : int
    """
    batch, units = c.shape
    width = units + h.shape[1]
    for k in range(cuda.grid(1), batch * width, cuda.gridsize(1)):
        b = k // width
        u = k % width
        if u < units:
            out[c_offset + b * c_row + u] = c[b, u]
        else:
            out[h_offset + b * h_row + u - units] = h[b, u - units]


@kernel("cell")
def gather_rows(src: A3, first: A2, index: INDEX, shift: I64, dst: A3, zero: SCALAR):
    """``dst[t, b] = src[index[t, b] - shift, b]``; ``first[b]`` where ``0 <= index < shift``; zero where ``index < 0``.

    Rows between time order and step order (:mod:`nblstm.schedule`).

    Parameters
    ----------
    src : [S, B, N] array
    first : [B, N] array
        The row before ``src[0]`` (read only with ``shift = 1``).
    index : [T, B] int64 array
    shift : int
        0 or 1.
    dst : [T, B, N] array
    zero : scalar of the dtype of ``dst``
    """
    steps, batch, width = dst.shape
    per_step = batch * width
    for k in range(cuda.grid(1), steps * per_step, cuda.gridsize(1)):
        t = k // per_step
        rest = k % per_step
        b = rest // width
        n = rest % width
        i = index[t, b]
        if i < 0:
            dst[t, b, n] = zero
        elif i < shift:
            dst[t, b, n] = first[b, n]
        else:
            dst[t, b, n] = src[i - shift, b, n]


@kernel("cell")
def scatter_add_rows(src: A3, index: INDEX, dst: A3, zero: SCALAR):
    """``dst[s, b] = sum of src[t, b] over the times t with index[t, b] == s``, in time order (zero where none).

    One thread per column ``(b, n)``, over every time of its example: no
    atomics, a fixed order of the sums.

    Parameters
    ----------
    src : [T, B, N] array
    index : [T, B] int64 array
        Values in ``[-1, S)``.
    dst : [S, B, N] array
    zero : scalar of the dtype of ``dst``
    """
    steps, batch, width = dst.shape
    for k in range(cuda.grid(1), batch * width, cuda.gridsize(1)):
        b = k // width
        n = k % width
        for s in range(steps):
            dst[s, b, n] = zero
        for t in range(src.shape[0]):
            i = index[t, b]
            if i >= 0:
                dst[i, b, n] += src[t, b, n]
