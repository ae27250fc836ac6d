"""Tile sizes, launch limits and switches of the CUDA target, in one place.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every thread as a Python
thread: it gets tiny tiles, which also makes the tiny test shapes span
several tiles, so the boundary handling is exercised. Kernels read these
module globals at compile time (numba freezes them as constants: shared
array shapes must be constants).
"""

try:  # numba-cuda keeps its own configuration module.
    from numba.cuda.core import config as numba_cuda_config
except ImportError:  # pragma: no cover - older numba-cuda
    from numba import config as numba_cuda_config

__all__ = [
    "ALIGN",
    "BLAS",
    "GATE_COLS",
    "GEMM_BK",
    "GEMM_BM",
    "GEMM_BN",
    "GEMM_RM",
    "GEMM_RN",
    "GEMM_TX",
    "GEMM_TY",
    "LINEAR_MAX_BLOCKS",
    "LINEAR_THREADS",
    "MAX_GRID_Y",
    "PERSISTENT",
    "PERSISTENT_MAX_BATCH",
    "RESIDENT",
    "RESIDENT_CHUNK",
    "RESIDENT_LANES",
    "RESIDENT_MAX_BATCH",
    "SB",
    "STEP_GEMM",
    "SIMULATOR",
    "SJ",
    "SK",
    "SK_PAD",
    "ceil_div",
    "numba_cuda_config",
    "padded",
    "size",
]

#: True when running in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
SIMULATOR = bool(numba_cuda_config.ENABLE_CUDASIM)

if SIMULATOR:
    GEMM_TX, GEMM_TY, GEMM_RM, GEMM_RN, GEMM_BK = 2, 2, 2, 2, 2
    SJ, SB, SK = 2, 2, 3
    LINEAR_THREADS = 8
else:
    # The GEMM: 256 threads, each a 4 x 4 micro-tile of a 64 x 64 output tile, K tiles of 16.
    GEMM_TX, GEMM_TY, GEMM_RM, GEMM_RN, GEMM_BK = 16, 16, 4, 4, 16
    # Step kernels: 128 threads, SJ = 32 hidden units x SB = 4 batch rows, K tiles of SK = 32.
    SJ, SB, SK = 32, 4, 32
    LINEAR_THREADS = 256
#: Output tile of the GEMM: ``GEMM_BM`` rows by ``GEMM_BN`` columns.
GEMM_BM = GEMM_TY * GEMM_RM
GEMM_BN = GEMM_TX * GEMM_RN
#: Columns of a step tile's shared weight block (four gates of ``SJ`` units).
GATE_COLS = 4 * SJ
#: Row length of a shared K tile with one padding column: thread ``tx`` reads
#: row ``tx``, so an odd row length spreads a warp's reads over the banks.
SK_PAD = SK + 1
#: CUDA's limit on gridDim.y (and z); gridDim.x may reach 2**31 - 1.
MAX_GRID_Y = 65535
#: Most blocks of a one-dimensional launch: those kernels are grid-stride loops.
LINEAR_MAX_BLOCKS = 1024
#: Scratch and result regions start at multiples of this many elements
#: (256 bytes in float32): aligned, coalesced accesses in every region.
ALIGN = 64

#: When :meth:`nblstm.cuda.launch.Launcher.gemm` calls cuBLAS (:mod:`nblstm.cuda.blas`): ``"auto"`` (on a GPU,
#: when a binding is importable), ``True`` (whenever a binding is there, the simulator included: tests put one of
#: their own in place) or ``False`` (never: the tiled kernel). Read at every call.
BLAS = "auto"

#: When to use the persistent (cooperative, one launch for all steps)
#: kernels: ``"auto"`` (batch at most :data:`PERSISTENT_MAX_BATCH` and the
#: tiles fit in one cooperative grid), ``True`` (whenever possible) or
#: ``False`` (never). Read at every call.
PERSISTENT = "auto"
PERSISTENT_MAX_BATCH = 16

#: When the time loops outside the persistent kernels run one GEMM per step (``h_{t-1} @ W_h`` onto the input
#: projection, by cuBLAS) and one gate kernel, instead of one fused tiled kernel per step: ``"auto"`` (when the
#: products run on cuBLAS), ``True`` (always: the tests run it on the tiled GEMM in the simulator) or ``False``.
STEP_GEMM = "auto"

#: Whether the persistent loops of the fused ops first try the kernels that keep ``W_h`` in shared memory
#: (:mod:`nblstm.cuda.resident`): ``"auto"`` (where the slices fit on chip) or ``False``. Read at every call.
RESIDENT = "auto"
#: Largest batch the resident kernels take when :data:`PERSISTENT` is ``"auto"`` (a step's arithmetic grows with
#: the batch while its weight traffic does not: past this the per-step cuBLAS loop takes over).
RESIDENT_MAX_BATCH = 64
#: Threads that share one hidden unit's products in the resident kernels (``blockDim.x``; read at every call).
#: One warp on a GPU: a warp's lanes read consecutive shared-memory words. One in the simulator, where the sums
#: then run in the order of the tiled step kernels (the simulator's results stay bit for bit those of the
#: per-step kernels); the tests set more.
RESIDENT_LANES = 1 if SIMULATOR else 32
#: Most columns of the vector operand a resident kernel stages at a time; ``None``: as many as fit in shared
#: memory next to the weights (the tests set a few, to run the staging loop over several chunks).
RESIDENT_CHUNK = None


def ceil_div(a, b):
    return -(-a // b)


def padded(n):
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def size(shape):
    """Number of elements of ``shape`` (an int or a tuple)."""
    if isinstance(shape, int):
        return shape
    n = 1
    for d in shape:
        n *= int(d)
    return n
