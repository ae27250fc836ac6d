"""The one list of the CUDA target's kernels (their signatures for compile-only checks: :mod:`nblstm.cuda.catalog`).

Every kernel is declared with :func:`kernel` instead of ``@cuda.jit``: it is
the same lazy ``cuda.jit`` dispatcher (nothing compiles at import), recorded
here with its family. Its parameters are annotated with the kind of value
each one is launched with (numba does not read annotations), so that the
argument list is written once, in the kernel's own ``def``, and
:func:`nblstm.cuda.catalog.signatures` derives the types the kernel compiles for in each dtype
(``numba.cuda.compile_ptx``: the PTX checks run with no GPU). Kinds:

:data:`A1` .. :data:`A4`
    C-contiguous array of the compute dtype, of that rank.
:data:`ANY1` .. :data:`ANY3`
    Array of the compute dtype, any layout (the source of a copy).
:data:`SCALAR`
    Scalar of the compute dtype.
:data:`I64`, :data:`BOOL`
    ``int64``, ``bool``.
:data:`LENGTHS`
    C-contiguous ``[B]`` int64 array.
:data:`INDEX`
    C-contiguous ``[T, B]`` int64 array (the maps of :mod:`nblstm.schedule`).
:class:`Record`
    A record (a ``NamedTuple`` class, or ``tuple``) whose fields have the
    kinds it names: ``Record(ForwardOutputs, A3)`` (one kind for every field) or
    ``Record(KernelOptions, SCALAR, SCALAR, BOOL, ...)`` (one per field).
    Numba types it as a (named) tuple and a launch passes its fields as
    consecutive kernel parameters. :data:`OPTIONS` (the call's
    :class:`nblstm.options.KernelOptions` in the compute dtype) and
    :data:`BLOCKS` (the gate block indices ``(i, ci, f, o)``) are the
    common ones; the kernel modules declare their arrays' records.

Kernels that also run on float16 storage arrays (``storage=True``: the
dtype casts and the fill) get float16 signatures too: a copy from float16
(any layout) to float32 and back, and the fill in float16.
"""

from numba import cuda

from ..options import KernelOptions

__all__ = ["A1", "A2", "A3", "A4", "ANY1", "ANY2", "ANY3", "BLOCKS", "BOOL", "I64", "INDEX", "KERNELS", "LENGTHS",
           "OPTIONS", "SCALAR", "Record", "kernel"]

# The kinds of kernel parameters (annotations of the kernels' parameters).
A1, A2, A3, A4 = "a1", "a2", "a3", "a4"
ANY1, ANY2, ANY3 = "any1", "any2", "any3"
SCALAR, I64, BOOL, LENGTHS, INDEX = "s", "i64", "b", "lengths", "index"


class Record:
    """The kind of a record parameter: its class (a ``NamedTuple`` class, or ``tuple``) and the kinds of its fields
    (one for every field, or one per field)."""

    __slots__ = ("cls", "kinds")

    def __init__(self, cls, *kinds):
        self.cls = cls
        self.kinds = kinds

    def field_kinds(self):
        """The kind of each field, in order."""
        if self.cls is tuple:
            return self.kinds
        fields = len(self.cls._fields)
        if len(self.kinds) == 1:
            return self.kinds * fields
        if len(self.kinds) != fields:
            raise ValueError(f"{self!r}: {len(self.kinds)} kinds for the {fields} fields of {self.cls.__name__}")
        return self.kinds

    def __repr__(self):
        return f"Record({self.cls.__name__}, {', '.join(map(repr, self.kinds))})"


#: The options of a call (:class:`nblstm.options.KernelOptions`), its bounds in the compute dtype
#: (:meth:`nblstm.cuda.launch.Launcher.kernel_options`).
OPTIONS = Record(KernelOptions, SCALAR, SCALAR, BOOL, SCALAR, BOOL, I64, BOOL, BOOL)
#: The gate block indices ``(i, ci, f, o)`` of a layout (:data:`nblstm.spec.GATE_BLOCKS`).
BLOCKS = Record(tuple, I64, I64, I64, I64)

#: ``[(family, dispatcher, storage)]`` of every kernel, in declaration order.
KERNELS = []


def kernel(family, storage=False):
    """Declare a kernel of ``family`` (``"common"``, ``"fused"`` or ``"cell"``): ``@kernel("fused")``."""

    def declare(func):
        dispatcher = cuda.jit(func)
        KERNELS.append((family, dispatcher, storage))
        return dispatcher

    return declare
