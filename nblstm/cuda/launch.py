"""Memory and launches of one call: the scratch arena, per-step launches, the launcher.

Host overhead matters as much as the kernels here: at small sizes a call is
bound by what the host does per launch and per allocation (each costs
driver calls). So a call makes one device allocation for all its results
and takes its temporaries (input projections, gate gradients, dtype casts)
from scratch memory kept between calls (:class:`Arena`); the per-step loop
launches a kernel whose arguments were converted once (:class:`Repeat`);
the forward kernels get their seven outputs as one array; with one visible
GPU no pointer is queried for its device. :func:`call` opens one
entry-point call: checks, device, stream, arena, :class:`Launcher`.
"""

import collections
import contextlib
import functools

import numpy as np
from numba import cuda

from .._validate import compute_dtype
from ..options import CellOptions
from . import blas, config
from .config import (
    ALIGN,
    GEMM_BM,
    GEMM_BN,
    GEMM_TX,
    GEMM_TY,
    LINEAR_MAX_BLOCKS,
    LINEAR_THREADS,
    MAX_GRID_Y,
    SB,
    SIMULATOR,
    SJ,
    ceil_div,
    numba_cuda_config,
    padded,
    size,
)
from .elementwise import column_sums, copy1, copy2, copy3, fill, fill2, fill_rows, peephole_grads, peephole_products
from .gemm import gemm
from .interop import (
    as_device,
    check_same_device,
    context_cache,
    gpu_count,
    on_device,
    require_gpu,
    resolve_stream,
    storage_dtype,
    stream_handle,
    wrap_like,
)
from .resident import RB, shared_words

__all__ = ["LOOPS", "Arena", "Launcher", "Repeat", "arena_for", "call", "regions", "release_workspaces"]

#: How many time loops of each kind this process ran (:meth:`Launcher.recurrence`): ``"resident"``,
#: ``"gemm-steps"``, ``"persistent"``, ``"per-step"``. For benchmarks and tests, which clear it.
LOOPS = collections.Counter()


class Arena:
    """Scratch memory reused by successive calls on one device, stream and compute dtype.

    A call takes its temporaries from ``buffer`` in order; what does not fit
    is allocated for that call, and the next call allocates one buffer of the
    largest total seen (so from the second call of a size on, a call makes
    no scratch allocation). Calls on one stream run in order on the GPU, so
    a call may reuse the memory of the previous one; ``lock`` keeps the
    calls of several host threads from interleaving their launches. ``zeros``
    is a buffer of zeros that kernels only read (absent gradients), ``ones``
    one of ones (the bias gradient as a cuBLAS product).
    """

    __slots__ = ("lock", "buffer", "need", "zeros", "ones")

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.buffer = None
        self.need = 0
        self.zeros = None
        self.ones = None


_ARENAS = {}


def arena_for(device, stream):
    """The :class:`Arena` of ``(device, stream)`` (created on first use)."""
    handle = stream_handle(stream)
    if handle is None:
        handle = ("object", id(stream))
    elif handle == 0 and getattr(numba_cuda_config, "CUDA_PER_THREAD_DEFAULT_STREAM", False):
        import threading

        handle = ("per-thread", threading.get_ident())
    key = (device, handle)
    arena = _ARENAS.get(key)
    if arena is None:
        arena = _ARENAS.setdefault(key, {})
    return arena


def release_workspaces():
    """Free the scratch memory kept between calls of the CUDA target.

    It is allocated again, at the size needed, by the next call.
    """
    for arenas in list(_ARENAS.values()):
        for arena in list(arenas.values()):
            with arena.lock:
                arena.buffer = arena.zeros = arena.ones = None
                arena.need = 0
    _ARENAS.clear()


class Repeat:
    """Launches of one kernel with fixed arguments after a varying int64 first one (the step index).

    On a GPU the arguments are converted to kernel parameters once, and each
    launch passes them straight to the launch function Numba itself calls:
    a step costs one launch call instead of Numba's conversion of every
    argument. Where Numba's internals differ from those this was written
    for (other versions, the simulator), each launch goes through the
    configured kernel.
    """

    def __init__(self, kernel, griddim, blockdim, stream, args):
        self._configured = kernel[griddim, blockdim, stream]
        self._args = args
        self._fast = None if SIMULATOR else self._prepare(kernel, args)

    def _prepare(self, dispatcher, args):
        import ctypes

        try:
            from numba.cuda import dispatcher as numba_dispatcher

            launch = numba_dispatcher.launch
            config_type = numba_dispatcher.LaunchConfig
            new_config = numba_dispatcher.CUDA_CORE_GE_1_0
            configured = self._configured
            all_args = (0, *args)
            kernel = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in all_args))
            if getattr(kernel, "debug", True) or getattr(kernel, "extensions", None):
                return None
            params, writeback = [], []
            for ty, value in zip(kernel.argument_types, all_args, strict=True):
                kernel._prepare_args(ty, value, configured.stream, writeback, params)
            if writeback or not isinstance(params[0], ctypes.c_int64):
                return None
            options = dict(grid=configured.griddim, block=configured.blockdim, shmem_size=0)
            cooperative = bool(kernel.cooperative)
            options["is_cooperative" if new_config else "cooperative_launch"] = cooperative
            launch_config = config_type(**options)
            handle = kernel._codelibrary.get_cufunc().kernel
            stream = configured.stream
        except Exception:  # noqa: BLE001 - other Numba internals: the ordinary launch path
            return None
        rest = params[1:]

        def fast(first):
            launch(stream, launch_config, handle, ctypes.c_int64(first), *rest)

        return fast

    def __call__(self, first):
        if self._fast is not None:
            self._fast(first)
        else:
            self._configured(first, *self._args)


class Launcher:
    """Memory and launches of one call on one stream, in one compute dtype.

    Parameters
    ----------
    dtype : numpy.dtype
        Compute dtype (float32 or float64).
    storage : numpy.dtype
        Storage dtype of the caller's arrays (float16, float32 or float64).
    stream : Numba stream or 0
    arena : Arena
        Scratch memory of this device, stream and compute dtype; held by the
        caller for the call.
    wrap : callable
        Turns a Numba device array into the caller's array kind.
    precision : str
        Precision of the GEMMs (:data:`nblstm.options.PRECISIONS`); anything
        but ``"exact"`` needs cuBLAS (checked by :func:`call`).

    Attributes
    ----------
    blas : int or None
        The cuBLAS handle of this device and stream when the GEMMs run on
        cuBLAS (:func:`nblstm.cuda.blas.available`), else ``None``.
    """

    def __init__(self, dtype, storage, stream, arena, wrap, precision="exact"):
        self.dtype = np.dtype(dtype)
        self.storage = np.dtype(storage)
        self.stream = stream
        self.one = self.dtype.type(1.0)
        self._arena = arena
        self._wrap = wrap
        self._used = 0
        self.scratch_total = 0
        self._results = None
        self.device = 0  # set by call()
        self.precision = precision
        self.blas = None  # set by call()
        if arena.need and (arena.buffer is None or arena.buffer.shape[0] < arena.need):
            arena.buffer = None  # freed before the larger one is allocated
            arena.buffer = self.empty(arena.need)

    def kernel_options(self, options, has_proj=False, use_peepholes=False):
        """The call's options as the kernels take them: one :class:`nblstm.options.KernelOptions`, built here only.

        Parameters
        ----------
        options : nblstm.options.OpOptions or nblstm.options.CellOptions
        has_proj, use_peepholes : bool
            The cell's (its weights decide them); not read for the fused ops.

        Returns
        -------
        nblstm.options.KernelOptions
            The record of :meth:`~nblstm.options.OpOptions.kernel_options`
            (or ``CellOptions``'), its bounds and ``forget_bias`` in the
            compute dtype: a float32 kernel then takes no float64 parameter
            (no float64 conversion in its PTX), and computes with the values
            the same scalars used to carry.
        """
        dt = self.dtype.type
        if isinstance(options, CellOptions):
            record = options.kernel_options(has_proj, use_peepholes)
        else:
            record = options.kernel_options(dt)
        return record._replace(forget_bias=dt(record.forget_bias), cell_clip=dt(record.cell_clip),
                               proj_clip=dt(record.proj_clip))

    def _linear(self, kernel, n, *args):
        if n > 0:
            blocks = min(ceil_div(n, LINEAR_THREADS), LINEAR_MAX_BLOCKS)
            kernel[blocks, LINEAR_THREADS, self.stream](*args)

    def empty(self, shape, dtype=None):
        """A new device allocation (the only place this module allocates)."""
        return cuda.device_array(shape, self.dtype if dtype is None else dtype, stream=self.stream)

    def scratch(self, shape):
        """A C-contiguous array of the compute dtype, valid for this call only, from the arena."""
        n = size(shape)
        span = padded(n)
        buffer = self._arena.buffer
        if buffer is not None and self._used + span <= buffer.shape[0]:
            view = buffer[self._used:self._used + n]
            self._used += span
        else:
            view = self.empty(n)
        self.scratch_total += span
        return view.reshape(shape)

    def read_only_zeros(self, shape):
        """A C-contiguous array of zeros that kernels must only read (kept between calls)."""
        n = size(shape)
        arena = self._arena
        if arena.zeros is None or arena.zeros.shape[0] < n:
            arena.zeros = None
            arena.zeros = self.empty(max(n, ALIGN))
            self.fill_zero(arena.zeros)
        return arena.zeros[:n].reshape(shape)

    def read_only_ones(self, n):
        """A ``[n]`` array of ones that kernels must only read (kept between calls)."""
        arena = self._arena
        if arena.ones is None or arena.ones.shape[0] < n:
            arena.ones = None
            arena.ones = self.empty(max(n, ALIGN))
            self._linear(fill, arena.ones.shape[0], arena.ones, self.one)
        return arena.ones[:n]

    def results(self, n):
        """A flat ``[n]`` array of the compute dtype to hold all the call's results (see :meth:`finish`).

        One allocation; for float16 storage the results are computed in
        scratch memory and :meth:`finish` casts them into one allocation.
        """
        flat = self.empty(n) if self.storage == self.dtype else self.scratch(n)
        self._results = flat
        return flat

    def finish(self, parts):
        """The results as arrays of the storage dtype and the caller's kind.

        Parameters
        ----------
        parts : sequence of (int, tuple)
            ``(offset, shape)`` of each result in the flat array of :meth:`results`.

        Returns
        -------
        list
            Views of one allocation, wrapped once in the caller's kind.
        """
        flat = self._results
        if self.storage != self.dtype:
            cast = self.empty(flat.shape[0], self.storage)
            self._linear(copy1, flat.shape[0], flat, cast)
            flat = cast
        wrapped = self._wrap(flat)
        return [wrapped[offset:offset + size(shape)].reshape(shape) for offset, shape in parts]

    def fill_zero(self, out):
        """Zero a device array: C-contiguous, or a 2-D view with any strides."""
        count = size(out.shape)
        if not count:
            return
        zero = out.dtype.type(0)
        if len(out.shape) == 2 and not out.is_c_contiguous():
            self._linear(fill2, count, out, zero)
        else:
            flat = out.reshape(count)
            self._linear(fill, count, flat, zero)

    def prepare(self, *values, keep=False):
        """Each value as a C-contiguous device array of the compute dtype.

        No copy when a value is one already; otherwise a device-side copy
        (cast) into scratch memory, or with ``keep`` into an allocation of
        its own that outlives the call (kept for a later backward pass).
        ``None`` stays ``None``.
        """
        prepared = []
        for value in values:
            if value is not None:
                value = as_device(value, self.stream)
                if np.dtype(value.dtype) != self.dtype or not value.is_c_contiguous():
                    src = value
                    value = (self.empty if keep else self.scratch)(tuple(src.shape))
                    self.copy(src, value)
            prepared.append(value)
        return prepared

    def copy(self, src, dst):
        """``dst[...] = src`` with a cast; 1-3 dimensions, any strides."""
        kernel = {1: copy1, 2: copy2, 3: copy3}[len(src.shape)]
        self._linear(kernel, size(src.shape), src, dst)

    def elementwise(self, kernel, n, *args):
        """Launch ``kernel(*args)``, a grid-stride loop over ``n`` elements (no launch when ``n == 0``)."""
        self._linear(kernel, n, *args)

    def gemm(self, a, b, c, bias=None, trans_a=False, trans_b=False, accumulate=False, precision=None):
        """``c = op(a) @ op(b) [+ bias] [+ c]``: cuBLAS (:func:`nblstm.cuda.blas.gemm`) or the tiled kernel
        (:func:`nblstm.cuda.gemm.gemm`).

        ``a``, ``b`` and ``c`` are 2-D with contiguous rows (row slices of
        C-contiguous arrays); ``bias`` and ``accumulate`` are not given together.
        ``precision`` replaces the call's (``"exact"`` for the sums of the
        gradients, whose reduced-precision operands would save nothing).
        """
        m, n = c.shape
        if m == 0 or n == 0:
            return
        if self.blas is not None:
            if bias is not None:
                self._linear(fill_rows, m * n, c, bias)
            beta = 1.0 if bias is not None or accumulate else 0.0
            blas.gemm(self.blas, a, b, c, bool(trans_a), bool(trans_b), beta, precision or self.precision)
            return
        grid = (ceil_div(n, GEMM_BN), min(ceil_div(m, GEMM_BM), MAX_GRID_Y))
        use_bias = bias is not None
        gemm[grid, (GEMM_TX, GEMM_TY), self.stream](
            a, b, c, bias if use_bias else c.reshape(m * n), bool(trans_a), bool(trans_b), bool(accumulate), use_bias)

    def column_sums(self, m, out):
        """``out[n] = sum_r m[r, n]``: with cuBLAS the product ``ones[1, R] @ m``, else one thread per column."""
        if self.blas is not None:
            rows = m.shape[0]
            self.gemm(self.read_only_ones(rows).reshape(1, rows), m, out.reshape(1, out.shape[0]), precision="exact")
            return
        self._linear(column_sums, out.shape[0], m, out, self.dtype.type(0))

    def peephole_grads(self, steps, cs_prev, cs_, dgates, blocks, out):
        """The peephole gradients ``out = (wci_grad, wcf_grad, wco_grad)``: with cuBLAS their terms, then their
        column sums as products with ones; else one thread per unit (:func:`nblstm.cuda.elementwise.peephole_grads`)."""
        batch, units = cs_prev.shape
        bi, _, bf, bo = blocks
        if self.blas is not None:
            rows = steps * batch
            terms = self.scratch((rows, 3 * units))
            self._linear(peephole_products, rows * units, steps, cs_prev, cs_, dgates, bi, bf, bo, terms)
            ones = self.read_only_ones(rows).reshape(1, rows)
            for k, grad in enumerate(out):
                self.gemm(ones, terms[:, k * units:(k + 1) * units], grad.reshape(1, units), precision="exact")
            return
        self._linear(peephole_grads, units, steps, cs_prev, cs_, dgates, bi, bf, bo, self.dtype.type(0), *out)

    def recurrence(self, persistent, step, args, steps, batch, units, reverse=False, step_args=(), resident=None,
                   gemm_steps=None):
        """Run the time loop, the first of these that applies:

        1. one cooperative launch of ``resident`` (:mod:`nblstm.cuda.resident`;
           its forward kernel unless ``reverse``), called with ``(steps, *args,
           per_block, chunk)``, where :meth:`resident_plan` finds it fits;
        2. ``gemm_steps()``, a loop of one GEMM and one gate kernel per step,
           where :meth:`step_gemm` says so: cuBLAS reads ``W_h`` once per step,
           where the tiled loops below read it again for every tile of 4 rows;
        3. one cooperative launch of ``persistent`` with ``(steps, *args)``
           (small batches);
        4. one launch of ``step`` per step with ``(t, *step_args, *args)`` for
           ``t`` in order (reversed with ``reverse``).
        """
        if resident is not None and self.resident(resident, steps, args, batch, units, not reverse):
            return
        if gemm_steps is not None and self.step_gemm():
            gemm_steps()
            LOOPS["gemm-steps"] += 1
            return
        block = (SJ, SB)
        blocks = self.persistent_grid(persistent, (steps, *args), batch, units)
        if blocks:
            persistent[blocks, block, self.stream](steps, *args)
            LOOPS["persistent"] += 1
            return
        LOOPS["per-step"] += 1
        grid = (ceil_div(units, SJ), ceil_div(batch, SB))
        launch = Repeat(step, grid, block, self.stream, (*step_args, *args))
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            launch(t)

    def resident(self, kernel, steps, args, batch, units, forward):
        """One launch of the resident ``kernel`` with ``(steps, *args, per_block, chunk)`` where
        :meth:`resident_plan` finds it fits; whether it ran."""
        plan = self.resident_plan(kernel, (steps, *args), batch, units, forward)
        if plan is None:
            return False
        blocks, block, nbytes, per_block, chunk = plan
        kernel[blocks, block, self.stream, nbytes](steps, *args, per_block, chunk)
        LOOPS["resident"] += 1
        return True

    def step_gemm(self):
        """Whether the time loop runs one GEMM per step (:data:`nblstm.cuda.config.STEP_GEMM`)."""
        return config.STEP_GEMM is True or (config.STEP_GEMM == "auto" and self.blas is not None)

    def repeat_linear(self, kernel, n, args):
        """A :class:`Repeat` of the grid-stride ``kernel`` over ``n`` elements: ``launch(t)`` runs
        ``kernel(t, *args)``."""
        blocks = max(1, min(ceil_div(n, LINEAR_THREADS), LINEAR_MAX_BLOCKS))
        return Repeat(kernel, blocks, LINEAR_THREADS, self.stream, args)

    def step_product(self, b, rows, trans_b=False, accumulate=False):
        """``product(a, a_row, c, c_row)``: ``c[c_row:c_row + rows] = a[a_row:a_row + rows] @ op(b) [+ c[...]]``.

        ``a: [R, K]`` and ``c: [R', N]`` are C-contiguous. On cuBLAS the
        arguments are converted once and each call passes two addresses
        (:class:`nblstm.cuda.blas.StepGemm`): a step makes no array view.
        Otherwise it is :meth:`gemm` on views.
        """
        if self.blas is None:
            return lambda a, a_row, c, c_row: self.gemm(a[a_row:a_row + rows], b, c[c_row:c_row + rows],
                                                        trans_b=trans_b, accumulate=accumulate)
        product = blas.StepGemm(self.blas, b, rows, trans_b, 1.0 if accumulate else 0.0, self.precision)
        bases = {}

        def address(array, row):
            base = bases.get(id(array))
            if base is None:
                base = bases[id(array)] = (blas.pointer(array), array.strides[0])
            return base[0] + row * base[1]

        return lambda a, a_row, c, c_row: product(address(a, a_row), address(c, c_row))

    def resident_plan(self, kernel, args, batch, units, forward):
        """``(blocks, block, shared bytes, per_block, chunk)`` of a resident launch of ``kernel``, or ``None``.

        ``None`` where the persistent loops are off (:data:`~nblstm.cuda.config.PERSISTENT`,
        :data:`~nblstm.cuda.config.RESIDENT`), the batch exceeds
        :data:`~nblstm.cuda.config.RESIDENT_MAX_BATCH` (with ``PERSISTENT``
        ``"auto"``; :data:`~nblstm.cuda.config.PERSISTENT_MAX_BATCH` with a
        reduced ``precision``, whose per-step products run on tensor cores,
        which the resident kernels' float32 arithmetic does not reach), or
        the slices do not fit: one block per multiprocessor, each with its
        ``U = ceil(H / SMs)`` units' weights and a reduction buffer within the
        opt-in shared memory of a block.
        """
        if config.PERSISTENT is False or config.RESIDENT is False or batch < 1:
            return None
        limit = config.RESIDENT_MAX_BATCH if self.precision == "exact" else config.PERSISTENT_MAX_BATCH
        if config.PERSISTENT == "auto" and batch > limit:
            return None
        lanes = int(config.RESIDENT_LANES)
        k_total = units if forward else 4 * units
        if SIMULATOR:  # the simulator's grid barrier synchronises one block only
            per_block, budget = units, 1 << 30
        else:
            device = cuda.get_current_device()
            per_block = ceil_div(units, int(device.MULTIPROCESSOR_COUNT))
            budget = _shared_optin(device.id) // self.dtype.itemsize
        if lanes * per_block > 1024:
            return None
        fixed = shared_words(forward, per_block, units, batch, lanes, 0)
        if fixed > budget:
            return None
        chunk = min(k_total, (budget - fixed) // min(batch, RB), config.RESIDENT_CHUNK or k_total)
        if chunk < k_total and chunk >= 32:
            chunk -= chunk % 32  # whole warps' worth of columns per staged chunk
        if chunk < 1:
            return None
        nbytes = shared_words(forward, per_block, units, batch, lanes, chunk) * self.dtype.itemsize
        blocks = ceil_div(units, per_block)
        block = (lanes, per_block)
        if not SIMULATOR:
            compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in (*args, 0, 0)))  # numba caches it
            device_id = cuda.get_current_device().id
            if not _allow_shared(compiled, device_id, nbytes) or _resident_blocks(compiled, device_id, block,
                                                                                  nbytes) < blocks:
                return None
        return blocks, block, nbytes, per_block, chunk

    def persistent_grid(self, kernel, args, batch, units):
        """Blocks for a persistent launch of ``kernel``, or 0 to use per-step launches."""
        if config.PERSISTENT is False or (config.PERSISTENT == "auto" and batch > config.PERSISTENT_MAX_BATCH):
            return 0
        tiles = ceil_div(units, SJ) * ceil_div(batch, SB)
        if SIMULATOR:
            # The simulator's grid barrier synchronises one block only.
            return 1
        limit = _cooperative_limit(kernel, tuple(kernel.typeof_pyval(a) for a in args),
                                   cuda.get_current_device().id)
        if config.PERSISTENT == "auto" and limit < tiles:
            return 0
        return max(1, min(tiles, limit))


@functools.lru_cache(maxsize=16)
def _shared_optin(device_id):
    """Most bytes of shared memory one block may opt in to on ``device_id`` (48 KB where the query fails)."""
    try:
        return int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    except Exception:  # noqa: BLE001 - an attribute this driver binding does not name: the portable limit
        return 48 * 1024


def _allow_shared(compiled, device_id, nbytes):
    """Let ``compiled`` launch with ``nbytes`` of dynamic shared memory on ``device_id``; False where that fails.

    Above 48 KB a kernel needs the function attribute
    ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``. It is set to the
    device's opt-in maximum, the same value whatever ``nbytes`` (a smaller
    value set for one call would refuse a larger launch of another), and
    at every call: a context reset forgets it, and setting it costs one
    driver call.
    """
    if nbytes <= 48 * 1024:
        return True
    try:
        from numba.cuda.cudadrv import driver as numba_driver

        attribute = numba_driver.binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        cufunc = compiled._codelibrary.get_cufunc()
        numba_driver.driver.cuKernelSetAttribute(attribute, _shared_optin(device_id), cufunc.handle, device_id)
    except Exception:  # noqa: BLE001 - other Numba internals: no resident launch
        return False
    return True


@functools.lru_cache(maxsize=256)
def _resident_blocks(compiled, device_id, block, nbytes):
    """Most blocks of one cooperative launch of ``compiled`` with ``nbytes`` of dynamic shared memory (cached:
    the occupancy query costs more than a launch)."""
    return compiled.max_cooperative_grid_blocks(block, nbytes)


@functools.lru_cache(maxsize=64)
def _cooperative_limit(kernel, argtypes, device_id):
    """Most blocks of ``(SJ, SB)`` threads one cooperative launch of ``kernel`` may have on ``device_id``.

    Cached: the occupancy query costs more than a launch.
    """
    return kernel.compile(argtypes).max_cooperative_grid_blocks((SJ, SB))


def regions(run, shapes):
    """``(offsets, total)`` of consecutive regions of the given shapes in one flat results array.

    Aligned, except where the results are cast to float16 as one block
    (the padding would be cast too).
    """
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        total += padded(size(shape)) if run.storage == run.dtype else size(shape)
    return offsets, total


def check_precision(precision, dtype):
    """Refuse a ``precision`` the GEMMs cannot honour here (:data:`nblstm.options.PRECISIONS`).

    Raises
    ------
    ValueError
        Reduced precision without cuBLAS (the simulator, no binding, or
        :data:`nblstm.cuda.config.BLAS` ``False``), or for float64.
    """
    if precision == "exact":
        return
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"precision={precision!r} applies to float32 and float16 arrays; float64 arrays compute "
                         "exactly: pass precision='exact'")
    if not blas.available():
        raise ValueError(f"precision={precision!r} needs cuBLAS on a GPU (nvmath-python, from the cuda extra, or "
                         "CuPy), and nblstm.cuda.config.BLAS not False; the tiled GEMM computes exactly only: pass "
                         "precision='exact'")


@contextlib.contextmanager
def call(named, stream, wrap=None, precision="exact"):
    """Checks and context of one entry-point call.

    Yields a :class:`Launcher` in the compute dtype on the resolved
    stream, holding the scratch memory of that device and stream for the
    call. ``named["x"]`` (else the first array given) decides the storage
    dtype, the default stream and the kind of the results; ``wrap``, when
    given, replaces the latter (:mod:`nblstm.cuda.cell` returns Numba device
    arrays). The launcher's ``device`` is the ordinal of the GPU it runs on;
    its GEMMs run in ``precision`` (checked by :func:`check_precision`).
    """
    require_gpu()
    first = named["x"] if named.get("x") is not None else next(v for v in named.values() if v is not None)
    ordinal = check_same_device(named)
    with on_device(ordinal), context_cache():
        storage = storage_dtype(first)
        dtype = compute_dtype(storage)
        check_precision(precision, dtype)
        launch_stream = resolve_stream(stream, first)
        if ordinal is not None:
            device = ordinal
        else:
            device = 0 if SIMULATOR or gpu_count() <= 1 else cuda.get_current_device().id
        arenas = arena_for(device, launch_stream)
        arena = arenas.get(dtype)
        if arena is None:
            arena = arenas.setdefault(dtype, Arena())
        with arena.lock:
            run = Launcher(dtype, storage, launch_stream, arena, wrap or wrap_like(first, ordinal), precision)
            run.device = device
            if blas.available():
                run.blas = blas.handle_for(device, stream_handle(launch_stream) or 0)
            try:
                yield run
            finally:
                arena.need = max(arena.need, run.scratch_total)
