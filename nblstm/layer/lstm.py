"""``nblstm.LSTM``: a stacked, optionally bidirectional LSTM layer with ``torch.nn.LSTM``'s API.

Each layer and direction is an :class:`nblstm.LSTMCell` run over the whole
sequence in fused kernels; the reverse direction runs each example reversed
within its own length (or over its unmasked steps last to first) inside the
kernels (:mod:`nblstm.schedule`). Between layers the layer only moves
arrays (:mod:`nblstm.arrays`): the directions' outputs side by side,
dropout when training.
"""

import functools
import numbers

import numpy as np

from .. import _validate as v
from .. import arrays
from ..cell import LSTMCell
from ..cell.cell import checked_backward, checked_forward, set_checked_weights, skips_sorted_rows
from ..cell.weights import checked_weights, weight_shapes
from ..cpu.partition import directions_at_once
from ..cpu.threads import run_each
from ..interchange import accepts_any_array
from ..schedule import by_length, schedule

__all__ = ["LSTM"]

#: The keywords the ``from_*`` constructors take besides the source: options that keep its results.
_PORTING_OVERRIDES = ("batch_first", "dropout", "dtype", "seed", "zero_output_for_mask", "forget_bias", "precision")


class LSTM:
    """A multi-layer, optionally bidirectional LSTM: ``torch.nn.LSTM``'s constructor and call, on nblstm's kernels.

    Parameters
    ----------
    input_size : int
        ``I``, the depth of the inputs.
    hidden_size : int
        ``H``, the units of each cell.
    num_layers : int, default 1
        ``L``, cells stacked: layer ``l + 1`` reads layer ``l``'s outputs.
    bias : bool, default True
        ``False``: the biases are zero and not trained (no ``bias`` weights).
    batch_first : bool, default False
        Inputs and outputs ``[B, T, ...]`` instead of ``[T, B, ...]``.
    dropout : float, default 0.0
        Dropout on the outputs of every layer but the last, in ``[0, 1)``,
        applied only by calls with ``training=True`` (seeded by ``seed``).
    bidirectional : bool, default False
        ``D = 2`` directions per layer, their outputs side by side (forward first).
    proj_size : int, default 0
        ``P``: each cell's output projected to ``P`` columns (``0``: ``P = H``).
    use_peepholes, cell_clip, proj_clip, activation, recurrent_activation
        Options of every cell, as :class:`nblstm.LSTMCell`'s (PyTorch has none of them).
    forget_bias : float, default 0.0
        Added to the forget gate (0, PyTorch's maths; TensorFlow 1 cells use 1).
    zero_output_for_mask : bool, default False
        Calls with a ``mask``: masked steps output zeros instead of repeating
        the previous output (Keras's option; its ``Bidirectional`` sets it).
    reverse : bool, default False
        Without ``bidirectional``: the one direction runs backwards (an ONNX
        ``direction="reverse"`` node); its outputs stay in time order.
    go_backwards : bool, default False
        Keras's ``go_backwards`` (one layer, one direction): the sequence is
        read last step first, as ``reverse=True`` does, and the outputs come in
        that processing order: ``output[:, k]`` (batch-first) is the output
        after the step ``T - 1 - k``. A mask applies to the steps it was given
        for; ``sequence_length`` stands for the mask of the steps before each
        length (Keras reverses the padded sequence: the padding comes first).
    dtype : float16, float32 or float64, default float32
    seed : int, optional
        Seeds the initial weights (PyTorch's: uniform in ``±1 / sqrt(H)``) and the dropout masks.
    precision : {"exact", "tf32", "fp16"}, default "exact"
        Arithmetic of the large matrix products on the GPU (:class:`nblstm.LSTMCell`).

    Attributes
    ----------
    cells : tuple of LSTMCell
        ``L * D`` cells, the cell of layer ``l`` and direction ``d`` at ``l * D + d``.
    rng : numpy.random.Generator
        Draws the dropout masks (``numpy.random.default_rng(seed)`` at first); replace it to draw others.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> lstm = nblstm.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True, proj_size=3, seed=0)
    >>> x = np.ones((2, 6, 5), np.float32)                            # [B, T, I]
    >>> output, (h_n, c_n) = lstm(x, sequence_length=[6, 3])
    >>> output.shape, h_n.shape, c_n.shape                            # [B, T, D * P], [L * D, B, P], [L * D, B, H]
    ((2, 6, 6), (4, 2, 3), (4, 2, 4))
    >>> bool((output[1, 3:] == 0).all())                              # past example 1's length
    True
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, *, use_peepholes=False, cell_clip=None, proj_clip=None,
                 forget_bias=0.0, activation="tanh", recurrent_activation="sigmoid", zero_output_for_mask=False,
                 reverse=False, go_backwards=False, dtype=np.float32, seed=None, precision="exact"):
        self.input_size = v.check_positive_int("input_size", input_size)
        self.hidden_size = v.check_positive_int("hidden_size", hidden_size)
        self.num_layers = v.check_positive_int("num_layers", num_layers)
        self.bias = v.check_bool("bias", bias)
        self.batch_first = v.check_bool("batch_first", batch_first)
        self.dropout = v.check_real("dropout", dropout)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.bidirectional = v.check_bool("bidirectional", bidirectional)
        if isinstance(proj_size, (bool, np.bool_)) or not isinstance(proj_size, numbers.Integral) or proj_size < 0:
            raise ValueError(f"proj_size must be an int >= 0, got {proj_size!r}")
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size must be smaller than hidden_size (as in PyTorch), got proj_size={proj_size}, "
                             f"hidden_size={hidden_size}")
        self.proj_size = int(proj_size)
        self.dtype = v.check_dtype("dtype", dtype, allow_none=False)
        if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.seed = seed
        self.zero_output_for_mask = v.check_bool("zero_output_for_mask", zero_output_for_mask)
        self.reverse = v.check_bool("reverse", reverse)
        if self.reverse and bidirectional:
            raise ValueError("reverse=True is for one direction; a bidirectional layer already has a reverse one")
        self.go_backwards = v.check_bool("go_backwards", go_backwards)
        if self.go_backwards and (bidirectional or self.reverse or self.num_layers > 1):
            raise ValueError(f"go_backwards=True is Keras's option of one layer run backwards: it needs num_layers=1 "
                             f"and one direction (got num_layers={num_layers}, bidirectional={bidirectional}, "
                             f"reverse={reverse}); stack such layers as separate nblstm.LSTM layers")
        self.rng = np.random.default_rng(seed)
        self.num_directions = 2 if self.bidirectional else 1
        depth = self.proj_size or self.hidden_size
        cells = []
        for layer in range(self.num_layers):
            for _ in range(self.num_directions):
                cell = LSTMCell(self.hidden_size, use_peepholes=use_peepholes, cell_clip=cell_clip,
                                num_proj=self.proj_size or None, proj_clip=proj_clip, forget_bias=forget_bias,
                                activation=activation, recurrent_activation=recurrent_activation, dtype=self.dtype,
                                precision=precision)
                inputs = self.input_size if layer == 0 else self.num_directions * depth
                cell.set_weights(self._initial_weights(cell, inputs))
                cells.append(cell)
        self.cells = tuple(cells)
        first = self.cells[0]
        self.use_peepholes, self.cell_clip, self.proj_clip = first.use_peepholes, first.cell_clip, first.proj_clip
        self.forget_bias, self.activation = first.forget_bias, first.activation.name
        self.recurrent_activation = first.recurrent_activation
        self.precision = first.precision

    def _initial_weights(self, cell, inputs):
        """PyTorch's initialisation: every weight uniform in ``±1 / sqrt(H)`` (the bias: ``b_ih + b_hh``)."""
        bound = 1.0 / np.sqrt(self.hidden_size)
        weights = {}
        for name, shape in weight_shapes(inputs, self.hidden_size, cell.num_proj, cell.use_peepholes).items():
            value = self.rng.uniform(-bound, bound, shape)
            if name == "bias":
                value = value + self.rng.uniform(-bound, bound, shape) if self.bias else np.zeros(shape)
            weights[name] = value.astype(self.dtype)
        return weights

    # -- sizes and weights -----------------------------------------------------------------------------

    @property
    def output_size(self):
        """``D * P``, the last axis of the outputs."""
        return self.num_directions * (self.proj_size or self.hidden_size)

    def _prefix(self, index):
        layer, direction = divmod(index, self.num_directions)
        return f"l{layer}{'_reverse' if direction else ''}/"

    @property
    def weight_names(self):
        """Names of :meth:`get_weights`: ``"l{layer}[_reverse]/{cell weight name}"``, cell after cell.

        Examples
        --------
        >>> import nblstm
        >>> nblstm.LSTM(3, 2, bidirectional=True).weight_names
        ('l0/kernel', 'l0/bias', 'l0_reverse/kernel', 'l0_reverse/bias')
        """
        return tuple(self._prefix(k) + n for k, cell in enumerate(self.cells) for n in cell.weight_names
                     if self.bias or n != "bias")

    def get_weights(self):
        """Every cell's weights (copies) as ``{"l0/kernel": [I + P, 4H], "l0/bias": [4H], ...}``.

        The layout is :class:`nblstm.LSTMCell`'s (gate blocks i, j, f, o);
        :meth:`to_torch` gives PyTorch's.
        """
        out = {}
        for k, cell in enumerate(self.cells):
            for name, a in cell.get_weights().items():
                if self.bias or name != "bias":
                    out[self._prefix(k) + name] = a
        return out

    @accepts_any_array
    def set_weights(self, weights):
        """Replace every cell's weights from a dict keyed like :meth:`get_weights` (exactly those names)."""
        if not isinstance(weights, dict):
            raise TypeError(f"weights must be a dict keyed like get_weights(), got {type(weights).__name__}")
        expected = set(self.weight_names)
        missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
        if missing or unexpected:
            raise ValueError(f"weights: missing {missing}, unexpected {unexpected}")
        self.set_cell_weights([{n: weights[self._prefix(k) + n] for n in cell.weight_names if self.bias or n != "bias"}
                               for k, cell in enumerate(self.cells)])

    @accepts_any_array
    def set_cell_weights(self, cells, copy=True):
        """Replace the weights from one :class:`nblstm.LSTMCell` weight dict per cell, in :attr:`cells` order.

        Without ``bias`` a cell's dict has no ``bias``; a zero one is used. The
        arrays must have the layer's dtype (as :meth:`nblstm.LSTMCell.set_weights`);
        every cell's weights are checked before any is replaced. They are
        copied, unless ``copy`` is false: then the layer keeps the
        C-contiguous NumPy arrays that own their memory as they are (the
        caller made them for it and will not change them:
        ``nblstm.torch.LSTM``'s, made at every training step, where the copy
        took 0.2 ms a step at ``I = H = 256``); views are copied all the same.
        """
        copy = v.check_bool("copy", copy)
        if not isinstance(cells, (list, tuple)) or len(cells) != len(self.cells):
            raise ValueError(f"cells must be a list of {len(self.cells)} weight dicts (num_layers * num_directions)")
        checked = []
        for k, (cell, w) in enumerate(zip(self.cells, cells, strict=True)):
            w = dict(w)
            if not self.bias:
                if "bias" in w:
                    raise ValueError(f"cell {k} has a bias but the layer has bias=False")
                w["bias"] = np.zeros(4 * self.hidden_size, self.dtype)
            # Arrays of any kind (GPU arrays, tensors) are taken to the host by checked_weights, which names
            # anything else it is given.
            expected_in = cell.input_depth + cell.output_size
            shape = tuple(getattr(w.get("kernel"), "shape", ()))
            if shape and shape[0] != expected_in:
                raise ValueError(f"cell {k} ({self._prefix(k)[:-1]}): kernel has {shape[0]} rows; "
                                 f"expected {expected_in} (its input depth {cell.input_depth} + output depth "
                                 f"{cell.output_size})")
            try:  # every cell's weights validated (and copied) before any is replaced
                w = checked_weights(w, cell.num_units, cell.num_proj, cell.use_peepholes, cell.input_depth,
                                    cell.dtype, owned=() if copy else tuple(w))
            except (TypeError, ValueError) as e:
                raise type(e)(f"cell {k} ({self._prefix(k)[:-1]}): {e}") from None
            checked.append(w)
        for cell, w in zip(self.cells, checked, strict=True):
            set_checked_weights(cell, w)

    # -- porting -----------------------------------------------------------------------------------------

    @classmethod
    def _from(cls, config, cells, overrides):
        """A layer of ``config`` with the source's ``cells`` (for ``forget_bias = 0``) and the caller's ``overrides``.

        Only options that keep the source's results may be overridden; a
        ``forget_bias`` is taken out of the forget gate's bias, so that the
        layer computes what the source does.
        """
        unknown = sorted(set(overrides) - set(_PORTING_OVERRIDES))
        if unknown:
            raise TypeError(f"unexpected keyword arguments {unknown}: a converted layer takes its sizes and maths from "
                            f"the source; only {list(_PORTING_OVERRIDES)} may be given")
        if "dtype" in overrides:  # an explicit dtype converts the source's weights
            dt = v.check_dtype("dtype", overrides["dtype"], allow_none=False)
            cells = [{n: np.asarray(a).astype(dt) for n, a in w.items()} for w in cells]
        # The cells are for the source's forget_bias (0 but for nblstm's own modules): a new one moves the
        # difference out of the bias.
        forget_bias = v.check_real("forget_bias", overrides.get("forget_bias", config.get("forget_bias") or 0.0))
        forget_bias -= config.get("forget_bias") or 0.0
        if forget_bias and config.get("bias", True):
            units = int(config["hidden_size"])
            cells = [dict(w) for w in cells]
            for w in cells:
                bias = np.array(w["bias"], copy=True)
                bias[2 * units:3 * units] -= bias.dtype.type(forget_bias)  # ICFO: f is the third block
                w["bias"] = bias
        elif forget_bias:
            raise ValueError("forget_bias needs a bias to take it out of (the source has bias=False)")
        if not config.get("bias", True):  # the readers give zero biases; a layer without bias has none
            cells = [{n: a for n, a in w.items() if n != "bias"} for w in cells]
        config = {**config, **overrides}
        lstm = cls(**config)
        lstm.set_cell_weights(cells)
        return lstm

    @classmethod
    def from_torch(cls, module_or_state_dict, *, batch_first=None, **options):
        """A layer with the weights and sizes of a PyTorch ``nn.LSTM`` (every layer and direction, ``proj_size``).

        Parameters
        ----------
        module_or_state_dict : nn.LSTM or mapping
            The module (its sizes and ``batch_first`` are read), or its
            ``state_dict()`` of tensors or arrays (sizes inferred from the keys).
        batch_first : bool, optional
            Overrides the module's; ``False`` for a state dict when not given.
        **options
            ``dtype``, ``seed``, ``dropout``, ``zero_output_for_mask`` or
            ``forget_bias`` (taken out of the bias: the results stay the
            source's); the sizes and maths come from the source.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> source = nblstm.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, seed=0)
        >>> state_dict = source.to_torch(state_dict=True)               # nn.LSTM's keys and layouts
        >>> sorted(state_dict)[:3]
        ['bias_hh_l0', 'bias_hh_l0_reverse', 'bias_hh_l1']
        >>> lstm = nblstm.LSTM.from_torch(state_dict)
        >>> x = np.ones((5, 2, 3), np.float32)
        >>> np.array_equal(lstm(x)[0], source(x)[0])
        True
        """
        from ..porting import torch

        config, cells = torch.read(module_or_state_dict, batch_first=batch_first)
        if config.get("batch_first") is None:
            config["batch_first"] = False
        return cls._from(config, cells, options)

    def to_torch(self, *, state_dict=False):
        """A ``torch.nn.LSTM`` computing what this layer does: the same sizes, ``batch_first``, ``dropout`` and weights.

        Parameters
        ----------
        state_dict : bool, default False
            ``True``: the module's state dict as NumPy arrays instead (no
            PyTorch needed), for ``module.load_state_dict({k:
            torch.from_numpy(a) for k, a in state_dict.items()})``.

        Returns
        -------
        torch.nn.LSTM or dict
            ``nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size)``
            in the layer's dtype, on the CPU, in training mode as a new
            module is. ``forget_bias`` is folded into ``bias_ih``.

        Raises
        ------
        ValueError
            Options PyTorch does not have (peepholes, clips, other activations or gate functions,
            ``reverse=True``).
        ImportError
            PyTorch is not installed (``state_dict=True`` needs none).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> lstm = nblstm.LSTM(3, 4, bidirectional=True, batch_first=True, seed=0)
        >>> sorted(lstm.to_torch(state_dict=True))[:2]
        ['bias_hh_l0', 'bias_hh_l0_reverse']
        """
        from ..porting import torch as porting_torch

        state_dict = v.check_bool("state_dict", state_dict)
        if self.reverse or self.go_backwards:
            option = "reverse" if self.reverse else "go_backwards"
            raise ValueError(f"PyTorch nn.LSTM has no equivalent of {option}=True (one direction run backwards)")
        arrays = porting_torch.write(self._config(), [cell.get_weights() for cell in self.cells])
        if state_dict:
            return arrays
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("to_torch() needs PyTorch (pip install torch); to_torch(state_dict=True) gives the "
                              "weights as NumPy arrays without it") from exc
        module = torch.nn.LSTM(self.input_size, self.hidden_size, self.num_layers, bias=self.bias,
                               batch_first=self.batch_first, dropout=self.dropout, bidirectional=self.bidirectional,
                               proj_size=self.proj_size, dtype=getattr(torch, self.dtype.name))
        module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in arrays.items()})
        return module

    @classmethod
    def from_keras(cls, layer_or_model, **options):
        """A layer with the weights of Keras ``LSTM`` / ``Bidirectional(LSTM)`` layers (one, or a stack).

        Keras is batch-major (``batch_first=True``) and has no forget bias
        (``forget_bias=0``); the activations and gate function
        (``"hard_sigmoid"`` too) are read from the layers' configuration, as
        are ``zero_output_for_mask`` (a ``Bidirectional`` sets it to
        ``return_sequences``, as Keras does) and a single layer's
        ``go_backwards`` (outputs in processing order). Keras 2's
        ``CuDNNLSTM`` reads as the ``LSTM`` it is. What the layer cannot
        honour is refused (:func:`nblstm.porting.keras.read`). With
        ``return_sequences=False`` Keras returns the last output: the
        layer's ``h_n``.

        Parameters
        ----------
        layer_or_model : Keras layer, model, list or dict
            See :func:`nblstm.porting.keras.read`; Keras itself is not imported.
        **options
            As :meth:`from_torch`'s (``batch_first`` too).
        """
        from ..porting import keras

        config, cells = keras.read(layer_or_model)
        return cls._from(config, cells, options)

    @classmethod
    def stack_from_keras(cls, model, **options):
        """One layer per recurrent layer of a Keras stack whose layers differ (units, directions, activations).

        A stack of equal layers is one :meth:`from_keras` layer; a stack
        such as ``Bidirectional(LSTM(64)) -> LSTM(32)``, or one with a
        ``go_backwards`` layer, is a list, run in order with the same mask or lengths:
        ``for layer in layers: x, state = layer(x, mask=mask)``.

        Returns
        -------
        list of LSTM
        """
        from ..porting import keras

        layers = []
        for config, cells in keras.read_layers(model):
            layers.append(cls._from(config, cells, options))
        return layers

    @classmethod
    def from_onnx(cls, model_or_node, name=None, *, weights=None, **options):
        """A layer with the weights of an ONNX ``LSTM`` node (forward, reverse or bidirectional).

        ONNX's ``layout`` gives ``batch_first``; ``clip`` (a clip of every gate
        pre-activation) and ``input_forget`` have no nblstm equivalent and
        are refused, as are activations the kernels do not have, and a
        constant ``sequence_lens`` or initial state (pass them when calling
        the layer: ``sequence_length=``, ``hx``). The ONNX
        outputs are ``Y [T, D, B, H]``: ``output.reshape(T, B, D, H).transpose(0, 2, 1, 3)``
        (time-major) is ``Y``. A zero-length example's final state is its initial
        state here; onnxruntime returns zeros for it.

        Parameters
        ----------
        model_or_node : ModelProto, GraphProto, path or NodeProto
            Needs the ``onnx`` package (the ``onnx`` extra). A file that is
            not an ONNX model raises ``ValueError`` naming it.
        name : str, optional
            The node, when the model has several ``LSTM`` nodes.
        weights : dict, optional
            ``{initializer name: array}`` for a bare ``NodeProto``.
        **options
            As :meth:`from_torch`'s (``batch_first`` too).
        """
        from ..porting import onnx

        config, cells = onnx.read(model_or_node, name=name, weights=weights)
        return cls._from(config, cells, options)

    def get_config(self):
        """The constructor's keyword arguments of this layer: ``nblstm.LSTM(**lstm.get_config())`` is a layer
        like it (with initial weights).

        Examples
        --------
        >>> import nblstm
        >>> config = nblstm.LSTM(3, 4, batch_first=True, seed=0).get_config()
        >>> config["batch_first"], config["dtype"], nblstm.LSTM(**config).get_config() == config
        (True, 'float32', True)
        """
        return {**self._config(), "zero_output_for_mask": self.zero_output_for_mask, "reverse": self.reverse,
                "go_backwards": self.go_backwards, "seed": self.seed}

    def _config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
                "bias": self.bias, "batch_first": self.batch_first, "dropout": self.dropout,
                "bidirectional": self.bidirectional, "proj_size": self.proj_size,
                "use_peepholes": self.use_peepholes, "cell_clip": self.cell_clip, "proj_clip": self.proj_clip,
                "forget_bias": self.forget_bias, "activation": self.activation,
                "recurrent_activation": self.recurrent_activation, "dtype": self.dtype.name,
                "precision": self.precision}

    # -- calls -----------------------------------------------------------------------------------------

    @accepts_any_array
    def __call__(self, input, hx=None, *, sequence_length=None, mask=None, training=False):
        """``output, (h_n, c_n) = lstm(input, hx)``, as ``torch.nn.LSTM``.

        Parameters
        ----------
        input : [T, B, I] array (``[B, T, I]`` with ``batch_first``)
            NumPy or GPU array of the layer's dtype.
        hx : tuple, optional
            ``(h_0 [L * D, B, P], c_0 [L * D, B, H])``, PyTorch's order; zeros when omitted.
        sequence_length : [B] ints, optional
            Lengths in ``[0, T]`` (PyTorch's packed sequences, with zeros
            allowed): past an example's length its outputs are zero and its
            state is carried; the reverse direction starts at each example's last step.
        mask : [B, T] bools, optional
            Keras's mask, any pattern (not with ``sequence_length``): masked
            steps carry the state, and their outputs repeat the direction's
            previous output (zeros before its first step), or are zero with
            ``zero_output_for_mask``.
        training : bool, default False
            Apply ``dropout`` between layers.

        Returns
        -------
        tuple
            ``(output [T, B, D * P], (h_n [L * D, B, P], c_n [L * D, B, H]))``
            (``output`` batch-first with ``batch_first``), of the input's
            kind: NumPy arrays, or Numba device arrays for GPU inputs.

        Raises
        ------
        TypeError, ValueError
            Wrong types, ranks, shapes, dtypes, lengths outside ``[0, T]``, a
            mask with lengths. When ``hx``, ``sequence_length`` or ``mask``
            fits the input's other layout (``[T, B, I]`` read as ``[B, T, I]``
            or the reverse, ``T != B``), the message says so and names
            ``batch_first``.
        """
        return self._forward(input, hx, sequence_length, mask, training, with_grad=False)[:2]

    forward = __call__

    @accepts_any_array
    def vjp(self, input, hx=None, *, sequence_length=None, mask=None, training=False):
        """The call of :meth:`__call__` and a function giving its vector-Jacobian product.

        Returns
        -------
        tuple
            ``((output, (h_n, c_n)), backward)``: ``backward(d_output=None,
            d_hx=None)`` with ``d_output`` shaped like ``output`` and
            ``d_hx = (d_h_n, d_c_n)`` (each may be ``None``: zeros) returns
            ``(d_input, (d_h_0, d_c_0), d_weights)``, ``d_weights`` keyed like
            :meth:`get_weights` (NumPy arrays).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> lstm = nblstm.LSTM(3, 2, num_layers=2, bidirectional=True, dtype=np.float64, seed=0)
        >>> x = np.ones((4, 1, 3))                                      # [T, B, I]
        >>> (out, (h_n, c_n)), backward = lstm.vjp(x, sequence_length=[3])
        >>> d_x, (d_h0, d_c0), d_w = backward(np.ones_like(out))
        >>> d_x.shape, d_h0.shape, d_w["l1_reverse/kernel"].shape
        ((4, 1, 3), (4, 1, 2), (6, 8))
        """
        output, state, ctx = self._forward(input, hx, sequence_length, mask, training, with_grad=True)

        def backward(d_output=None, d_hx=None):
            """Gradients of the loss with respect to the input, the initial state and every weight."""
            return self._backward(ctx, d_output, d_hx)

        return (output, state), backward

    # -- internals -------------------------------------------------------------------------------------

    def _check_input(self, value):
        info = v.describe_array("input", value)
        layout = "[B, T, I] (batch_first=True)" if self.batch_first else "[T, B, I] (batch_first=False)"
        if len(info.shape) != 3:
            raise ValueError(f"input must have rank 3, {layout}, got shape {tuple(info.shape)}")
        if info.dtype != self.dtype:
            raise TypeError(f"input has dtype {info.dtype}; expected {self.dtype} (the layer's dtype)")
        if info.shape[2] != self.input_size:
            raise ValueError(f"input has shape {tuple(info.shape)}; its last axis must be input_size = "
                             f"{self.input_size}")
        return info

    def _check_hx(self, hx, batch, kind, name="hx"):
        """``(h_0, c_0)`` validated: ``[L * D, B, P]`` and ``[L * D, B, H]`` of the layer's dtype, or ``None``."""
        if hx is None:
            return None
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{name} must be a pair (h [L * D, B, P], c [L * D, B, H]) as in PyTorch, "
                            f"got {type(hx).__name__}")
        rows = self.num_layers * self.num_directions
        out = []
        for part, n, width in ((hx[0], f"{name}[0] (h)", self.proj_size or self.hidden_size),
                               (hx[1], f"{name}[1] (c)", self.hidden_size)):
            if part is None:
                out.append(None)
                continue
            info = v.describe_array(n, part)
            if info.kind != kind:
                raise TypeError(f"{n} must live where input does ({'a GPU' if kind == 'device' else 'NumPy'} array)")
            if info.dtype != self.dtype:
                raise TypeError(f"{n} has dtype {info.dtype}; expected {self.dtype} (the layer's dtype)")
            v.check_shape(info, (rows, batch, width), "[num_layers * num_directions, B, P or H]")
            out.append(part)
        return tuple(out)

    def _forward(self, input, hx, sequence_length, mask, training, with_grad):
        info = self._check_input(input)
        training = v.check_bool("training", training)
        kind = info.kind
        x = arrays.swap01(input, kind) if self.batch_first else input  # time-major from here on
        steps, batch = (info.shape[1], info.shape[0]) if self.batch_first else info.shape[:2]
        # hx, lengths or a mask sized for the other layout: the mistake is the input's layout, so say batch_first.
        pair = hx if isinstance(hx, (tuple, list)) and len(hx) == 2 else (None, None)
        v.check_layout_fit("input", tuple(info.shape), self.batch_first, f"batch_first={self.batch_first}",
                           f"use a layer with batch_first={not self.batch_first}, or pass input.swapaxes(0, 1)",
                           [("hx[0] (h)", pair[0], 1, 3), ("hx[1] (c)", pair[1], 1, 3),
                            ("sequence_length", sequence_length, 0, 1)], mask)
        hx = self._check_hx(hx, batch, kind)
        if mask is not None:
            if sequence_length is not None:
                raise ValueError("pass sequence_length or mask, not both")
            mask = v.check_mask(mask, steps, batch)
        # Checked once here for every cell, and one schedule per direction for all the layers.
        lengths = v.check_lengths(sequence_length if mask is None else None, steps, batch)
        # An inference call on the CPU runs the examples longest first, where the kernels skip those that have
        # finished (schedule.by_length); the same bits in the caller's order. A training call keeps the order:
        # its weight gradients sum over the examples in it, as does a call with dropout its masks.
        drop = training and self.dropout > 0 and self.num_layers > 1
        sort = sequence_length is not None and not with_grad and not drop and kind == "host" and all(
            skips_sorted_rows(cell, steps, batch, cell.input_depth, self.dtype) for cell in self.cells)
        order = by_length(lengths) if sort else None
        if order is not None:
            x, lengths = np.take(x, order, axis=1), lengths[order]
            hx = None if hx is None else tuple(None if p is None else np.take(p, order, axis=1) for p in hx)
        orders = {}
        layer_in = x
        finals, saved = [], []
        for layer in range(self.num_layers):
            outs, jobs = [], []
            in_info = v.describe_array("input", layer_in)
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                cell = self.cells[k]
                state = None
                if hx is not None:
                    state = (hx[1][k] if hx[1] is not None else None, hx[0][k] if hx[0] is not None else None)
                    state = self._state_for(cell, state, batch, kind)
                backwards = bool(d) or self.reverse or self.go_backwards
                if backwards not in orders:
                    orders[backwards] = schedule(steps, batch, lengths, mask, backwards, self.zero_output_for_mask)
                jobs.append(functools.partial(checked_forward, cell, in_info, layer_in, state, lengths,
                                              orders[backwards], with_grad))
            for out, final, cell_ctx in self._directions(jobs, kind, batch, layer_in.shape[2]):
                if with_grad:
                    saved.append(cell_ctx)
                outs.append(out)
                finals.append(final)
            layer_out = arrays.concat_columns(outs, kind)
            keep = None
            if drop and layer < self.num_layers - 1:
                keep = ((self.rng.random(layer_out.shape) >= self.dropout) / (1.0 - self.dropout)).astype(self.dtype)
                layer_out = arrays.multiply(layer_out, keep, kind)
            saved.append(keep)
            layer_in = layer_out
        if self.go_backwards:  # the outputs in processing order, as Keras returns them
            layer_in = arrays.flip0(layer_in, kind)
        h_n = arrays.stack([f.h for f in finals], kind)
        c_n = arrays.stack([f.c for f in finals], kind)
        if order is not None:  # back to the caller's order
            back = np.argsort(order)
            layer_in, h_n, c_n = (np.take(a, back, axis=1) for a in (layer_in, h_n, c_n))
        output = arrays.swap01(layer_in, kind) if self.batch_first else layer_in
        ctx = {"saved": saved, "kind": kind, "shape": (steps, batch)} if with_grad else None
        return output, (h_n, c_n), ctx

    def _directions(self, jobs, kind, batch, inputs):
        """The results of a layer's calls, one a direction: the two at once, a thread each, where a step is too
        small to split well between threads (:func:`nblstm.cpu.partition.directions_at_once`); each call's
        kernels split their work as they would alone, so that the results are the same bits."""
        if len(jobs) == 2 and kind == "host" and directions_at_once(batch, inputs, self.hidden_size):
            return run_each(jobs)
        return [job() for job in jobs]

    def _state_for(self, cell, state, batch, kind):
        """A cell's initial state from ``(c, h)`` rows of ``hx`` (a missing part: zeros)."""
        c, h = state
        if c is None or h is None:
            zeros = cell.zero_state(batch, self.dtype)
            c = arrays.to_kind(zeros.c, kind) if c is None else c
            h = arrays.to_kind(zeros.h, kind) if h is None else h
        return (c, h)

    def _backward(self, ctx, d_output, d_hx):
        kind = ctx["kind"]
        steps, batch = ctx["shape"]
        depth = self.proj_size or self.hidden_size
        if d_output is not None:
            info = v.describe_array("d_output", d_output)
            if info.kind != kind:
                raise TypeError("d_output must live where input did (NumPy or GPU)")
            if info.dtype != self.dtype:
                raise TypeError(f"d_output has dtype {info.dtype}; expected {self.dtype}")
            shape = (batch, steps, self.output_size) if self.batch_first else (steps, batch, self.output_size)
            v.check_shape(info, shape, "like output")
            d_output = arrays.swap01(d_output, kind) if self.batch_first else d_output
            if self.go_backwards:
                d_output = arrays.flip0(d_output, kind)
        d_hx = self._check_hx(d_hx, batch, kind, "d_hx") if d_hx is not None else None
        per_layer = 1 + self.num_directions
        d_h0, d_c0, d_w = [None] * len(self.cells), [None] * len(self.cells), {}
        d_layer = d_output
        for layer in range(self.num_layers - 1, -1, -1):
            block = ctx["saved"][layer * per_layer:(layer + 1) * per_layer]
            keep = block[-1]
            if keep is not None and d_layer is not None:
                d_layer = arrays.multiply(d_layer, keep, kind)
            d_in, jobs = None, []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                d_out = None if d_layer is None else arrays.columns(d_layer, d * depth, depth, kind)
                d_state = None
                if d_hx is not None:
                    d_state = (None if d_hx[1] is None else d_hx[1][k], None if d_hx[0] is None else d_hx[0][k])
                jobs.append(functools.partial(checked_backward, self.cells[k], block[d], d_out, d_state))
            inputs = self.input_size if layer == 0 else self.num_directions * depth
            for d, (d_x, (dc0, dh0), dw) in enumerate(self._directions(jobs, kind, batch, inputs)):
                k = layer * self.num_directions + d
                d_in = arrays.add(d_in, d_x, kind)
                d_c0[k], d_h0[k] = dc0, dh0
                for name, g in dw.items():
                    if self.bias or name != "bias":
                        d_w[self._prefix(k) + name] = g
            d_layer = d_in
        d_input = arrays.swap01(d_layer, kind) if self.batch_first else d_layer
        d_w = {name: d_w[name] for name in self.weight_names}
        return d_input, (arrays.stack(d_h0, kind), arrays.stack(d_c0, kind)), d_w

    def __repr__(self):
        extras = [f"num_layers={self.num_layers}"] if self.num_layers != 1 else []
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False),
                              ("proj_size", 0), ("reverse", False), ("go_backwards", False),
                              ("zero_output_for_mask", False)):
            if getattr(self, name) != default:
                extras.append(f"{name}={getattr(self, name)!r}")
        return f"LSTM({', '.join([str(self.input_size), str(self.hidden_size), *extras])})"
