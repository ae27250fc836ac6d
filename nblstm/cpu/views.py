"""Views of C-contiguous arrays for the kernels, which compile to a few instructions.

``a.reshape(-1)`` compiles numba's general reshape in every kernel that calls
it: the checks of the requested shape, the error it raises, the search for
strides (``numba_attempt_nocopy_reshape``) and a helper function for the
``-1``. The fused forward's :func:`~nblstm.cpu.fused._carry_state` took
0.55 s of the ops' first call on an empty cache with its seven
``reshape(-1)``, most of it lowering those. :func:`flat` is the same view of
a C-contiguous array (the type says so, checked when the kernel is typed)
built directly.
"""

from numba import types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array

__all__ = ["flat"]


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
