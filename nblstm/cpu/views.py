"""Views of C-contiguous arrays for the kernels, which compile to a few instructions.

``a.reshape(-1)`` compiles numba's general reshape in every kernel that calls
it: the checks of the requested shape, the error it raises, the search for
strides (``numba_attempt_nocopy_reshape``) and a helper function for the
``-1``. The fused forward's :func:`~nblstm.cpu.fused._carry_state` took
0.55 s of the ops' first call on an empty cache with its seven
``reshape(-1)``, most of it lowering those. :func:`flat` is the same view of
a C-contiguous array (the type says so, checked when the kernel is typed)
built directly, and :func:`matrix` the ``[rows, cols]`` view of a run of a
flat array's elements (``a[start:start + rows * cols].reshape((rows, cols))``):
the reshape's subroutine alone took 0.18 s of lowering in the fused forward's
worker, on an empty cache.

:func:`fill_zero` and :func:`copy_elements` zero and copy runs of elements of
such views as one ``llvm.memset`` or ``llvm.memmove``, where a loop would be
typed, lowered, vectorized and compiled again in every kernel that inlines
it (the carries of the examples past their length, the zeroed workspaces).
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array

__all__ = ["U", "copy_elements", "element_pointer", "fill_zero", "flat", "matrix"]

#: The type of offsets into flat views: unsigned, so that indexing needs no wraparound check.
U = np.uint64


@intrinsic
def flat(typingctx, a):
    """``a.reshape(-1)`` for an ``a`` of layout ``"C"`` (a typing error for any other): the 1-D view of its
    elements, sharing its memory and owner."""
    if not isinstance(a, types.Array) or a.layout != "C" or a.ndim < 1:
        return None
    target = a.copy(ndim=1, layout="C")

    def codegen(context, builder, signature, args):
        source = make_array(signature.args[0])(context, builder, args[0])
        view = make_array(target)(context, builder)
        size = cgutils.unpack_tuple(builder, source.shape)[0]
        for extent in cgutils.unpack_tuple(builder, source.shape)[1:]:
            size = builder.mul(size, extent)
        populate_array(view, data=source.data, shape=[size], strides=[source.itemsize], itemsize=source.itemsize,
                       meminfo=source.meminfo, parent=source.parent)
        return impl_ret_borrowed(context, builder, target, view._getvalue())

    return target(a), codegen


@intrinsic
def matrix(typingctx, a, start, rows, cols):
    """``a[start:start + rows * cols].reshape((rows, cols))`` for a 1-D C-contiguous ``a`` (:func:`flat`): the
    ``[rows, cols]`` C-contiguous view of those elements, sharing ``a``'s memory and owner. No bounds check:
    ``0 <= start``, ``0 <= rows``, ``0 <= cols`` and ``start + rows * cols <= a.size``."""
    if not (_is_flat(a) and all(isinstance(t, types.Integer) for t in (start, rows, cols))):
        return None
    target = a.copy(ndim=2, layout="C")

    def codegen(context, builder, signature, args):
        array_type, start_type, rows_type, cols_type = signature.args
        source = make_array(array_type)(context, builder, args[0])
        view = make_array(target)(context, builder)
        nrows = context.cast(builder, args[2], rows_type, types.intp)
        ncols = context.cast(builder, args[3], cols_type, types.intp)
        populate_array(view, data=_element(context, builder, array_type, args[0], start_type, args[1]),
                       shape=[nrows, ncols], strides=[builder.mul(ncols, source.itemsize), source.itemsize],
                       itemsize=source.itemsize, meminfo=source.meminfo, parent=source.parent)
        return impl_ret_borrowed(context, builder, target, view._getvalue())

    return target(a, start, rows, cols), codegen


def _is_flat(a, writable=False):
    return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and (a.mutable or not writable)


def element_pointer(context, builder, array_type, array, index):
    """In an intrinsic's code: the address of ``array[index]`` (a 1-D C-contiguous array, an ``intp`` index)."""
    return builder.gep(make_array(array_type)(context, builder, array).data, [index])


def _element(context, builder, array_type, array, index_type, index):
    """:func:`element_pointer` for an ``index`` of any integer type."""
    return element_pointer(context, builder, array_type, array, context.cast(builder, index, index_type, types.intp))


def _bytes(context, builder, array_type, count_type, count):
    """``count`` elements of ``array_type`` in bytes, as an ``intp``."""
    itemsize = context.get_abi_sizeof(context.get_data_type(array_type.dtype))
    return builder.mul(context.cast(builder, count, count_type, types.intp), ir.Constant(cgutils.intp_t, itemsize))


@intrinsic
def fill_zero(typingctx, a, start, count):
    """``a[start:start + count] = 0`` for a writable 1-D C-contiguous ``a`` (:func:`flat`), as one ``memset``: every bit
    zero, a positive zero. No bounds check: ``0 <= start``, ``0 <= count`` and ``start + count <= a.size``."""
    if not (_is_flat(a, writable=True) and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, start_type, count_type = signature.args
        ptr = _element(context, builder, array_type, args[0], start_type, args[1])
        cgutils.memset(builder, ptr, _bytes(context, builder, array_type, count_type, args[2]), 0)
        return context.get_dummy_value()

    return types.void(a, start, count), codegen


@intrinsic
def copy_elements(typingctx, dst, dst_start, src, src_start, count):
    """``dst[dst_start:dst_start + count] = src[src_start:src_start + count]`` for 1-D C-contiguous arrays of one
    dtype (:func:`flat`; ``dst`` writable), as one ``memmove`` (the runs may overlap). No bounds check, as
    :func:`fill_zero`."""
    if not (_is_flat(dst, writable=True) and _is_flat(src) and dst.dtype == src.dtype
            and all(isinstance(t, types.Integer) for t in (dst_start, src_start, count))):
        return None

    def codegen(context, builder, signature, args):
        dst_type, dst_start_type, src_type, src_start_type, count_type = signature.args
        to = _element(context, builder, dst_type, args[0], dst_start_type, args[1])
        source = _element(context, builder, src_type, args[2], src_start_type, args[3])
        cgutils.raw_memmove(builder, to, source, _bytes(context, builder, dst_type, count_type, args[4]), 1)
        return context.get_dummy_value()

    return types.void(dst, dst_start, src, src_start, count), codegen
