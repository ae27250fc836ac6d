"""``nblstm.torch.LSTM``: a drop-in for ``torch.nn.LSTM`` on nblstm's kernels, inside PyTorch's autograd.

The module has ``torch.nn.LSTM``'s constructor, parameters and
``state_dict`` keys (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``, ``weight_hr_l0``, ``..._reverse``), so that
``load_state_dict`` moves weights between the two both ways, and its
``forward(input, hx=None)`` takes tensors and ``PackedSequence``. A
``torch.autograd.Function`` runs :class:`nblstm.LSTM`'s forward and, in
the backward pass, the vector-Jacobian product of its kernels
(:meth:`nblstm.LSTM.vjp`). Where no gradient is asked (``torch.no_grad()``,
or no input, state or parameter that requires grad) the module runs the
layer's inference call instead, which keeps only what it returns. CPU
tensors are read and written in place (DLPack views: no copies); CUDA
tensors run nblstm's GPU target.

nblstm's options come on top: peepholes (parameters ``weight_ci_l0``,
``weight_cf_l0``, ``weight_co_l0``), ``cell_clip``, ``proj_clip`` and
``forget_bias``. PyTorch is needed only here (the ``torch`` extra); ``import
nblstm`` does not import it.

``torch.compile``: the Function's kernels are not PyTorch operations, so
TorchDynamo puts a graph break around it and runs it eagerly; the rest of a
compiled model is compiled as usual.
"""

import ctypes
import math
import os

import numpy as np

try:
    import torch
    from torch.nn.utils import rnn as torch_rnn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('nblstm.torch needs PyTorch (pip install torch, or the torch extra)') from exc

from .convert import SWAP_CF_BLOCKS, icfo_to_ifco, ifco_to_icfo
from .cpu import threads
from .cpu.pack import transpose_gates
from .layer import lstm as _layer

__all__ = ["LSTM"]

# The parameters' dtypes the kernels compute in, and the layer's dtype for each.
_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}

#: The OpenMP runtime PyTorch's operations run on (found through ``libtorch_cpu``'s own dependencies: its
#: libgomp, or the system's where numba's OpenMP layer loaded that first), whose threads run the kernels' workers
#: in the module's calls on the CPU (:class:`nblstm.cpu.threads.OpenMPTeam`: after each PyTorch operation its
#: threads spin for milliseconds, and nblstm's own would compete with them for the cores); ``None`` where it is
#: not found.
_TEAM = threads.OpenMPTeam.loaded(os.path.dirname(torch.__file__), r"libtorch_cpu\b")


def _host(t):
    """A tensor as an array the kernels read: a NumPy view of a CPU tensor, the tensor itself on a GPU."""
    t = t.detach()
    if t.is_cuda:
        return t.contiguous()
    return np.from_dlpack(t if t.is_contiguous() else t.contiguous())


def _numpy(t):
    """A parameter's values as a NumPy array on the host (a view of a CPU tensor)."""
    t = t.detach()
    return np.from_dlpack(t) if not t.is_cuda else t.cpu().numpy()


def _bits(params):
    """Copies of CPU parameters' bits (as unsigned integers, so that NaNs and signed zeros compare as bits), or
    ``None`` where one is on a GPU."""
    if any(t.is_cuda for t in params):
        return None
    return [_numpy(t).copy().view(f"u{t.element_size()}") for t in params]


def _libc_memcmp():
    """The C library's ``memcmp`` through ctypes (the process's own symbols), or ``None`` where it is not found."""
    try:
        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, TypeError, AttributeError):
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return memcmp


# An inference call compares the parameters' bytes with those its weights were made from: memcmp reads each
# once (0.10 ms a 4 MB pair here, np.array_equal 0.16 ms, which writes and reduces a mask).
_memcmp = _libc_memcmp()


def _same_bits(kept, params):
    """Whether ``params`` hold the bits ``kept`` (:func:`_bits`) holds."""
    if len(kept) != len(params):
        return False
    for a, t in zip(kept, params, strict=True):
        if t.is_cuda or a.shape != tuple(t.shape) or a.itemsize != t.element_size():
            return False
        b = _numpy(t).view(a.dtype)
        if _memcmp is not None and b.flags.c_contiguous and a.flags.c_contiguous:
            if b.nbytes and _memcmp(a.ctypes.data, b.ctypes.data, b.nbytes) != 0:
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def _cell_kernel(weight_ih, weight_hh):
    """The cell's ``kernel [I + P, 4H]`` (ICFO columns, C-contiguous) from PyTorch's ``[4H, I]`` and ``[4H, P]``.

    One tiled copy per matrix, the two at once (:func:`nblstm.cpu.pack.transpose_gates`): NumPy's transposing
    copy took 10x as long at ``I = H = 256``, and the weights and their gradients go through here at every
    step.
    """
    inputs = weight_ih.shape[1]
    kernel = np.empty((inputs + weight_hh.shape[1], weight_ih.shape[0]), weight_ih.dtype)
    transpose_gates([(np.ascontiguousarray(weight_ih), kernel[:inputs]),
                     (np.ascontiguousarray(weight_hh), kernel[inputs:])], SWAP_CF_BLOCKS, True)
    return kernel


def _torch_weight_grads(d_kernel, inputs):
    """PyTorch's ``(d_weight_ih [4H, I], d_weight_hh [4H, P])`` from the cell's ``d_kernel [I + P, 4H]``."""
    gates = d_kernel.shape[1]
    d_ih = np.empty((gates, inputs), d_kernel.dtype)
    d_hh = np.empty((gates, d_kernel.shape[0] - inputs), d_kernel.dtype)
    transpose_gates([(d_ih, d_kernel[:inputs]), (d_hh, d_kernel[inputs:])], SWAP_CF_BLOCKS, False)
    return d_ih, d_hh


def _tensor(a, like):
    """A kernel result as a tensor on ``like``'s device (no copy)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    return torch.as_tensor(a, device=like.device)


class _Function(torch.autograd.Function):
    """nblstm's forward and its vector-Jacobian product as one autograd node."""

    @staticmethod
    def forward(ctx, module, x, h0, c0, lengths, *params):
        with threads.on_team(_TEAM):
            layer = module._layer_with(params)
            hx = None if h0 is None else (_host(h0), _host(c0))
            (out, (h_n, c_n)), backward = layer.vjp(_host(x), hx, sequence_length=lengths,
                                                    training=module.training)
        ctx.backward, ctx.module, ctx.like, ctx.has_state = backward, module, x, h0 is not None
        return _tensor(out, x), _tensor(h_n, x), _tensor(c_n, x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_h_n, d_c_n):
        with threads.on_team(_TEAM):
            d_x, (d_h0, d_c0), d_w = ctx.backward(_host(d_out), (_host(d_h_n), _host(d_c_n)))
            grads = ctx.module._parameter_grads(d_w, ctx.like)
        d_h0, d_c0 = (_tensor(d_h0, ctx.like), _tensor(d_c0, ctx.like)) if ctx.has_state else (None, None)
        return (None, _tensor(d_x, ctx.like), d_h0, d_c0, None, *grads)


@torch.compiler.disable
def _apply(*args):
    """:class:`_Function` outside TorchDynamo's tracing: the kernels read memory that fake tensors do not have,
    so a compiled model breaks its graph here and runs the call eagerly."""
    return _Function.apply(*args)


@torch.compiler.disable
def _infer(module, x, h0, c0, lengths, *params):
    """The forward alone, where no gradient is asked (outside TorchDynamo's tracing, as :func:`_apply`): the
    layer's inference call, which keeps only what it returns (:meth:`nblstm.LSTM.__call__`)."""
    with threads.on_team(_TEAM):
        layer = module._layer_with(params, reuse=True)
        hx = None if h0 is None else (_host(h0), _host(c0))
        out, (h_n, c_n) = layer(_host(x), hx, sequence_length=lengths, training=module.training)
    return _tensor(out, x), _tensor(h_n, x), _tensor(c_n, x)


class LSTM(torch.nn.Module):
    """``torch.nn.LSTM`` on nblstm's kernels: the same constructor, parameters, ``state_dict`` and ``forward``.

    Parameters
    ----------
    input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size, device, dtype
        As ``torch.nn.LSTM``'s (``dtype`` float32 by default; float64 for
        ``gradcheck``; float16). ``.double()``, ``.half()``, ``.float()`` and
        ``.to(dtype)`` move the module as ``nn.LSTM``'s: the kernels follow
        the parameters' dtype. Dropout between layers uses nblstm's seeded
        generator (``seed``), not PyTorch's.
    use_peepholes : bool, default False
        Peephole weights ``weight_ci_l{k}``, ``weight_cf_l{k}``, ``weight_co_l{k}`` ``[H]`` (zero at first).
    cell_clip, proj_clip : float, optional
    forget_bias : float, default 0.0
        As :class:`nblstm.LSTM`'s.
    seed : int, optional
        Seeds the dropout masks.
    precision : {"exact", "tf32", "fp16"}, default "exact"
        Arithmetic of the large matrix products on the GPU, as :class:`nblstm.LSTM`'s (CUDA tensors only).

    Examples
    --------
    >>> import torch, nblstm.torch
    >>> reference = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    >>> lstm = nblstm.torch.LSTM(3, 4, num_layers=2, bidirectional=True)
    >>> lstm.load_state_dict(reference.state_dict())
    <All keys matched successfully>
    >>> x = torch.randn(5, 2, 3)
    >>> torch.allclose(lstm(x)[0], reference(x)[0], atol=1e-6)
    True
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, *, use_peepholes=False, cell_clip=None,
                 proj_clip=None, forget_bias=0.0, seed=None, precision="exact"):
        super().__init__()
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float16, torch.float32 or torch.float64, got {dtype}")
        self._layer = _layer.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                                  proj_size, use_peepholes=use_peepholes, cell_clip=cell_clip, proj_clip=proj_clip,
                                  forget_bias=forget_bias, dtype=_DTYPES[dtype], seed=seed, precision=precision)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        self.use_peepholes = use_peepholes
        directions = 2 if bidirectional else 1
        depth = proj_size or hidden_size
        self._names = []
        self._kept = None  # the parameters' bits the layer's weights were made from (_layer_with)
        for layer in range(num_layers):
            for d in range(directions):
                suffix = f"_l{layer}{'_reverse' if d else ''}"
                inputs = input_size if layer == 0 else directions * depth
                shapes = {"weight_ih": (4 * hidden_size, inputs), "weight_hh": (4 * hidden_size, depth)}
                if bias:
                    shapes.update(bias_ih=(4 * hidden_size,), bias_hh=(4 * hidden_size,))
                if proj_size:
                    shapes["weight_hr"] = (proj_size, hidden_size)
                if use_peepholes:
                    shapes.update(weight_ci=(hidden_size,), weight_cf=(hidden_size,), weight_co=(hidden_size,))
                for name, shape in shapes.items():
                    self.register_parameter(name + suffix, torch.nn.Parameter(
                        torch.empty(shape, device=device, dtype=dtype)))
                self._names.append((suffix, tuple(shapes)))
        self.reset_parameters()

    def reset_parameters(self):
        """PyTorch's initialisation: uniform in ``±1 / sqrt(hidden_size)`` (the peepholes zero)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("weight_c"):
                    p.zero_()
                else:
                    p.uniform_(-bound, bound)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False), ("proj_size", 0), ("use_peepholes", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s

    # -- the parameters as the kernels' cell weights and back ------------------------------------------

    def _ordered(self):
        """The parameters in the Function's argument order."""
        return [getattr(self, n + suffix) for suffix, names in self._names for n in names]

    def _layer_with(self, params, reuse=False):
        """The nblstm layer holding ``params`` (the module's parameters, as given to the Function).

        The weights are rearranged on views of the tensors, by NumPy and
        nblstm's own copies: a PyTorch operation here would wake PyTorch's
        OpenMP threads, whose spinning after it takes cores from the kernels
        that follow. :meth:`forward` has moved the layer to the parameters'
        dtype (:meth:`_follow`).
        """
        # PyTorch's version counters miss in-place changes made through .data (as gradcheck and hand-written
        # updates make them), so weights kept by counter could be stale. A training call rebuilds them (its
        # parameters change at every step); an inference call (``reuse``) keeps the layer's weights, packed,
        # while the parameters hold the same bits as when they were made: comparing them took 0.08 ms a MB,
        # rebuilding and packing a 2-layer H = 256 stack 4.4 ms (B = 1, T = 30).
        if reuse and self._kept is not None and _same_bits(self._kept, params):
            return self._layer
        self._kept = _bits(params) if reuse else None
        cells, k = [], 0
        for _suffix, names in self._names:
            p = {n: _numpy(t) for n, t in zip(names, params[k:k + len(names)], strict=True)}
            k += len(names)
            w = {"kernel": _cell_kernel(p["weight_ih"], p["weight_hh"])}
            if self.bias:
                w["bias"] = ifco_to_icfo(p["bias_ih"] + p["bias_hh"], axis=0)
            if self.use_peepholes:  # copies: the layer keeps what it is given (copy=False below)
                w.update(w_i_diag=p["weight_ci"].copy(), w_f_diag=p["weight_cf"].copy(),
                         w_o_diag=p["weight_co"].copy())
            if self.proj_size:
                w["projection/kernel"] = p["weight_hr"].T.copy()  # a copy even where .T is C-contiguous (P = 1)
            cells.append(w)
        self._layer.set_cell_weights(cells, copy=False)  # arrays made here, for the layer alone
        return self._layer

    def _follow(self, dtype):
        """The inner layer in ``dtype``, the parameters' (moved by ``.double()``, ``.half()``, ``.to(dtype)``).

        The layer is rebuilt with the same options (its dropout masks start again from ``seed``).
        """
        if dtype not in _DTYPES:
            raise TypeError(f"the module's parameters are {dtype}; nblstm.torch.LSTM computes in torch.float16, "
                            f"torch.float32 or torch.float64 (move it with .half(), .float() or .double())")
        layer = self._layer
        if layer.dtype == _DTYPES[dtype]:
            return
        self._kept = None
        self._layer = _layer.LSTM(**{**layer.get_config(), "dtype": _DTYPES[dtype]})

    def _parameter_grads(self, d_weights, like):
        """Gradients of the parameters, in :meth:`_ordered`'s order, from the layer's ``d_weights``."""
        grads = []
        for suffix, names in self._names:
            prefix = suffix[1:] + "/"  # "_l0_reverse" -> the layer's "l0_reverse/"
            inputs = getattr(self, "weight_ih" + suffix).shape[1]
            # The layer's weight gradients are NumPy arrays on either target.
            d_ih, d_hh = _torch_weight_grads(np.ascontiguousarray(d_weights[prefix + "kernel"]), inputs)
            found = {"weight_ih": d_ih, "weight_hh": d_hh}
            if self.bias:
                b = icfo_to_ifco(d_weights[prefix + "bias"], axis=0)
                found.update(bias_ih=b, bias_hh=b.copy())
            if self.use_peepholes:
                found.update(weight_ci=d_weights[prefix + "w_i_diag"], weight_cf=d_weights[prefix + "w_f_diag"],
                             weight_co=d_weights[prefix + "w_o_diag"])
            if self.proj_size:
                found["weight_hr"] = d_weights[prefix + "projection/kernel"].T
            grads.extend(torch.from_numpy(np.ascontiguousarray(found[n])).to(like.device) for n in names)
        return grads

    # -- forward ---------------------------------------------------------------------------------------

    def forward(self, input, hx=None):
        """``output, (h_n, c_n) = lstm(input, hx)``, as ``torch.nn.LSTM.forward``.

        Parameters
        ----------
        input : Tensor [T, B, I] (``[B, T, I]`` with ``batch_first``) or PackedSequence
        hx : tuple of Tensor, optional
            ``(h_0 [L * D, B, P], c_0 [L * D, B, H])``.

        Returns
        -------
        tuple
            ``(output, (h_n, c_n))``: ``output`` a Tensor ``[T, B, D * P]``
            (batch-first with ``batch_first``), or a PackedSequence for a
            PackedSequence input.
        """
        packed = isinstance(input, torch_rnn.PackedSequence)
        lengths = None
        if packed:
            padded, lengths_t = torch_rnn.pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = lengths_t.numpy().astype(np.int64)
            x = padded
        else:
            if not isinstance(input, torch.Tensor):
                raise TypeError(f"input must be a Tensor or a PackedSequence, got {type(input).__name__}")
            x = input
        params = self._ordered()
        self._follow(params[0].dtype)
        if x.dtype != params[0].dtype:
            raise TypeError(f"input has dtype {x.dtype}; expected {params[0].dtype} (the module's dtype)")
        if x.device != params[0].device:
            raise TypeError(f"input is on {x.device}; the module's parameters are on {params[0].device}")
        h0 = c0 = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError("hx must be a pair (h_0, c_0) of tensors")
            h0, c0 = hx
            for name, t in (("hx[0]", h0), ("hx[1]", c0)):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
        tensors = (x, *params) if h0 is None else (x, h0, c0, *params)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            out, h_n, c_n = _apply(self, x, h0, c0, lengths, *params)
        else:  # torch.no_grad(), or nothing that requires grad: inference
            out, h_n, c_n = _infer(self, x, h0, c0, lengths, *params)
        if packed:
            out = torch_rnn.pack_padded_sequence(out, lengths_t, batch_first=self.batch_first, enforce_sorted=False)
        return out, (h_n, c_n)
