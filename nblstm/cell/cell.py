"""TensorFlow's TF1 ``LSTMCell`` API (``tf.compat.v1.nn.rnn_cell.LSTMCell``) over fused kernels.

:class:`LSTMCell` keeps TensorFlow's constructor, variable names, shapes and
initial values, and its maths exactly (:ref:`spec-cell`): peepholes,
``cell_clip`` (``0.0`` clips the cell to zero), a projection with
``proj_clip``, any Keras activation by name, ``state_is_tuple``. On top of
the one-step call it runs whole sequences in fused kernels
(:mod:`nblstm.cpu.cell`, and :mod:`nblstm.cuda.cell` for GPU arrays: no
Python loop over time) with ``dynamic_rnn``
semantics for per-example lengths, and gives their exact gradients
(:meth:`LSTMCell.vjp`), with the true gradient of the clipping.

Arrays follow the cell's names: ``c`` the cell state ``[B, H]``, ``h``
(TensorFlow's ``m``) the output state ``[B, P]``, ``P = num_proj or H``.

GPU arrays: a cell called with arrays on a GPU (``__cuda_array_interface__``:
Numba device arrays, CuPy arrays, PyTorch CUDA tensors) runs the CUDA kernels
of :mod:`nblstm.cuda.cell`, with the same maths and semantics, and nothing
goes through the host but the lengths (validated on the host) and the weight
gradients. Outputs, states, ``d_inputs`` and the state gradients are Numba
device arrays of the inputs' dtype (wrap them with ``cupy.asarray`` or
``torch.as_tensor``: no copy). Weight gradients are NumPy arrays, like
:meth:`LSTMCell.get_weights`: the weights live on the host, where
:meth:`LSTMCell.set_weights` takes them. The weights are uploaded to a GPU
once, on first use, and kept there (per compute dtype and GPU) until
:meth:`LSTMCell.set_weights` or :meth:`LSTMCell.build` replaces them.
"""

import numbers
import os
import warnings

import numpy as np

from .. import _validate as v
from .. import convert
from .._dispatch import check_precision, target_for
from ..arrays import swap01
from ..interchange import accepts_any_array
from ..options import GATE_FUNCTIONS, PRECISIONS, CellOptions
from ..schedule import by_length, schedule
from .activations import activation_of
from .initializers import initializer_of
from .state import LSTMStateTuple, state_arrays
from .stepper import Stepper
from .weights import checked_weights, initial_weights, load, save, weight_shapes

__all__ = ["LSTMCell", "LSTMStateTuple", "checked_backward", "checked_forward", "set_checked_weights"]

_ALLOWED_KWARGS = ("trainable",)

class LSTMCell:
    """Long short-term memory cell of TensorFlow 1 (``tf.compat.v1.nn.rnn_cell.LSTMCell``), compiled.

    Parameters
    ----------
    num_units : int
        ``H``, the number of units of the cell.
    use_peepholes : bool, default False
        Diagonal peephole connections (``w_i_diag, w_f_diag, w_o_diag``).
    cell_clip : float, optional
        Clip the cell state to ``[-cell_clip, cell_clip]`` before its
        activation (``0.0`` clips it to zero, as in TensorFlow).
    initializer : str or callable, optional
        Initializer of ``kernel``, the peepholes and the projection: a name
        (:data:`nblstm.cell.INITIALIZER_NAMES`, default ``"glorot_uniform"``) or a
        callable ``(shape, dtype, rng) -> array``. ``bias`` starts at zero.
    num_proj : int, optional
        ``P``: project the output ``o * act(c)`` to ``P`` columns.
    proj_clip : float, optional
        With ``num_proj``: clip the projected output to ``[-proj_clip, proj_clip]``.
    num_unit_shards, num_proj_shards : int, optional
        Deprecated in TensorFlow (variable partitioning); accepted with a
        ``DeprecationWarning`` and ignored.
    forget_bias : float, default 1.0
        Added to the forget gate's pre-activation (inside the sigmoid).
    state_is_tuple : bool, default True
        State as :class:`LSTMStateTuple` ``(c, h)``; ``False``: one array
        ``[B, H + P]``, ``c`` then ``h``.
    activation : str or Activation, optional
        Activation of ``j`` and of the cell output (default tanh); a Keras
        name (:data:`nblstm.cell.ACTIVATION_NAMES`). Gates always use sigmoid.
    reuse : bool, optional
        Accepted for compatibility; a cell owns its variables.
    name : str, optional
    dtype : float16, float32 or float64, optional
        Dtype of the variables; ``None`` takes the dtype of the first inputs.
        float16 is computed in float32 and rounded to float16.
    seed : int, optional
        Seed of the initializer's random numbers (reproducible weights).
    recurrent_activation : {"sigmoid", "hard_sigmoid"}, default "sigmoid"
        The gate function (Keras's name; an nblstm extension: TensorFlow 1
        has sigmoid only). ``"hard_sigmoid"`` is Keras 3's, ``relu6(x + 3) / 6``.
    precision : {"exact", "tf32", "fp16"}, default "exact"
        Arithmetic of the large matrix products on the GPU (an nblstm
        extension; :func:`nblstm.block_lstm` describes the values). Calls on
        NumPy arrays need ``"exact"``.
    **kwargs
        ``trainable`` only; anything else is a ``TypeError``.

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type or value, naming it.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> cell = nblstm.LSTMCell(4, num_proj=3, seed=0)
    >>> x = np.ones((6, 2, 5), np.float32)                 # [T, B, I]
    >>> outputs, state = cell.run(x, sequence_length=[6, 2])
    >>> outputs.shape, state.c.shape, state.h.shape
    ((6, 2, 3), (2, 4), (2, 3))
    >>> bool((outputs[2:, 1] == 0).all())
    True
    """

    def __init__(self, num_units, use_peepholes=False, cell_clip=None, initializer=None, num_proj=None,
                 proj_clip=None, num_unit_shards=None, num_proj_shards=None, forget_bias=1.0, state_is_tuple=True,
                 activation=None, reuse=None, name=None, dtype=None, seed=None, recurrent_activation="sigmoid",
                 precision="exact", **kwargs):
        unknown = sorted(set(kwargs) - set(_ALLOWED_KWARGS))
        if unknown:
            raise TypeError(f"LSTMCell got unexpected keyword arguments: {', '.join(unknown)}")
        self.num_units = v.check_positive_int("num_units", num_units)
        self.use_peepholes = v.check_bool("use_peepholes", use_peepholes)
        self.cell_clip = v.check_clip_bound("cell_clip", cell_clip)
        self.initializer_name, self._initializer = initializer_of(initializer)
        self.num_proj = v.check_positive_int("num_proj", num_proj, allow_none=True)
        self.proj_clip = v.check_clip_bound("proj_clip", proj_clip)
        for shard_name, shards in (("num_unit_shards", num_unit_shards), ("num_proj_shards", num_proj_shards)):
            if shards is not None:
                v.check_positive_int(shard_name, shards)
                warnings.warn(f"{shard_name} is deprecated (as in TensorFlow) and ignored: nblstm does not "
                              "partition variables", DeprecationWarning, stacklevel=2)
        self.num_unit_shards, self.num_proj_shards = num_unit_shards, num_proj_shards
        self.forget_bias = v.check_real("forget_bias", forget_bias)
        self.state_is_tuple = v.check_bool("state_is_tuple", state_is_tuple)
        self.activation = activation_of(activation)
        self.recurrent_activation = v.check_choice("recurrent_activation", recurrent_activation, GATE_FUNCTIONS)
        self.precision = v.check_choice("precision", precision, PRECISIONS)
        if reuse is not None:
            v.check_bool("reuse", reuse)
        self.reuse = reuse
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        self.name = name or "lstm_cell"
        self._dtype = v.check_dtype("dtype", dtype)
        if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.seed = seed
        self.trainable = bool(kwargs.get("trainable", True))
        if self.use_peepholes and self.initializer_name == "orthogonal":
            raise ValueError("initializer='orthogonal' needs matrices; the peephole weights are vectors "
                             "(use another initializer with use_peepholes=True)")
        self.input_depth = None
        self._weights = None
        self._target_cache = {}

    # -- sizes and state -------------------------------------------------------------------------------

    @property
    def dtype(self):
        """Dtype of the variables (``None`` until built or given).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> nblstm.LSTMCell(2).dtype is None
        True
        >>> nblstm.LSTMCell(2, dtype=np.float64).dtype
        dtype('float64')
        """
        return self._dtype

    @property
    def built(self):
        """Whether the cell has its variables (after :meth:`build`, :meth:`set_weights` or a first call).

        Examples
        --------
        >>> import nblstm
        >>> cell = nblstm.LSTMCell(2)
        >>> cell.built
        False
        >>> cell.build(3)
        >>> cell.built
        True
        """
        return self._weights is not None

    @property
    def _depth(self):
        return self.num_proj or self.num_units

    @property
    def output_size(self):
        """``num_proj or num_units``.

        Examples
        --------
        >>> import nblstm
        >>> nblstm.LSTMCell(4).output_size, nblstm.LSTMCell(4, num_proj=2).output_size
        (4, 2)
        """
        return self._depth

    @property
    def state_size(self):
        """``LSTMStateTuple(num_units, num_proj or num_units)``, or their sum when ``state_is_tuple=False``.

        Examples
        --------
        >>> import nblstm
        >>> nblstm.LSTMCell(4, num_proj=2).state_size
        LSTMStateTuple(c=4, h=2)
        >>> nblstm.LSTMCell(4, num_proj=2, state_is_tuple=False).state_size
        6
        """
        if self.state_is_tuple:
            return LSTMStateTuple(self.num_units, self._depth)
        return self.num_units + self._depth

    def zero_state(self, batch_size, dtype):
        """Zero state: ``LSTMStateTuple(c [B, H], h [B, P])``, or one ``[B, H + P]`` array.

        Parameters
        ----------
        batch_size : int
        dtype : float16, float32 or float64

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> state = nblstm.LSTMCell(4, num_proj=2).zero_state(3, np.float32)
        >>> state.c.shape, state.h.shape, state.h.dtype
        ((3, 4), (3, 2), dtype('float32'))
        >>> nblstm.LSTMCell(4, num_proj=2, state_is_tuple=False).zero_state(3, np.float32).shape
        (3, 6)
        """
        batch = v.check_batch_size(batch_size)
        dt = v.check_dtype("dtype", dtype, allow_none=False)
        if self.state_is_tuple:
            return LSTMStateTuple(np.zeros((batch, self.num_units), dt), np.zeros((batch, self._depth), dt))
        return np.zeros((batch, self.num_units + self._depth), dt)

    @accepts_any_array
    def get_initial_state(self, inputs=None, batch_size=None, dtype=None):
        """Zero state for ``inputs`` (batch size and dtype from them) or for ``batch_size`` and ``dtype``.

        Parameters
        ----------
        inputs : [B, I] or [T, B, I] array, optional
            Batch-major for rank 2; time-major for rank 3 (as :meth:`run`).
        batch_size : int, optional
            Must agree with ``inputs`` when both are given.
        dtype : optional
            Must agree with ``inputs`` when both are given.

        Raises
        ------
        ValueError
            ``batch_size`` or ``dtype`` disagreeing with ``inputs``, or
            neither ``inputs`` nor both of them given.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(4)
        >>> state = cell.get_initial_state(np.ones((5, 3, 2)))  # inputs [T, B, I]
        >>> state.c.shape, state.h.shape, state.c.dtype
        ((3, 4), (3, 4), dtype('float64'))
        >>> cell.get_initial_state(batch_size=2, dtype=np.float32).h.shape
        (2, 4)
        """
        if inputs is not None:
            info = v.describe_array("inputs", inputs)
            if len(info.shape) not in (2, 3):
                raise ValueError(f"inputs must have rank 2 [B, I] or 3 [T, B, I], got shape {info.shape}")
            batch = info.shape[-2]
            if batch_size is not None and v.check_batch_size(batch_size) != batch:
                raise ValueError(f"batch_size={batch_size} disagrees with the batch size {batch} of inputs")
            if dtype is not None and v.check_dtype("dtype", dtype) != info.dtype:
                raise ValueError(f"dtype={np.dtype(dtype)} disagrees with the dtype {info.dtype} of inputs")
            state = self.zero_state(batch, info.dtype)
            return self._like(state, info.kind)
        if batch_size is None or dtype is None:
            raise ValueError("get_initial_state needs inputs, or both batch_size and dtype")
        return self.zero_state(batch_size, dtype)

    # -- variables -------------------------------------------------------------------------------------

    def _shapes(self, input_depth):
        return weight_shapes(input_depth, self.num_units, self.num_proj, self.use_peepholes)

    @property
    def weight_names(self):
        """Names of the variables, in TensorFlow's creation order.

        Examples
        --------
        >>> import nblstm
        >>> nblstm.LSTMCell(4, use_peepholes=True, num_proj=2).weight_names
        ('kernel', 'bias', 'w_f_diag', 'w_i_diag', 'w_o_diag', 'projection/kernel')
        """
        return tuple(self._shapes(1))

    def build(self, input_depth):
        """Create the variables for inputs of depth ``I`` (an int, or a shape whose last entry is ``I``).

        ``kernel``, the peepholes and the projection come from the
        initializer (drawn in TensorFlow's creation order from one generator
        seeded with ``seed``); ``bias`` is zero. The dtype is the cell's
        ``dtype`` (float32 when none was given).

        Examples
        --------
        >>> import nblstm
        >>> cell = nblstm.LSTMCell(4, num_proj=2, seed=0)
        >>> cell.build(3)  # I = 3
        >>> {name: a.shape for name, a in cell.get_weights().items()}
        {'kernel': (5, 16), 'bias': (16,), 'projection/kernel': (4, 2)}
        >>> cell.dtype
        dtype('float32')
        """
        if isinstance(input_depth, (tuple, list)):
            if not input_depth:
                raise ValueError("input_depth shape must not be empty")
            input_depth = input_depth[-1]
        depth = v.check_positive_int("input_depth", input_depth)
        if self._dtype is None:
            self._dtype = np.dtype(np.float32)
        weights = initial_weights(self._shapes(depth), self._dtype, self._initializer, self.seed)
        self.input_depth = depth
        self._set(weights)

    def _set(self, weights):
        self._weights = weights
        # What the targets make of the weights (packed for the CPU kernels,
        # uploaded for the CUDA kernels): made on first use, dropped when the
        # weights change.
        self._target_cache = {}

    def get_weights(self):
        """The variables as ``{name: array}`` (copies), in TensorFlow's creation order.

        Raises
        ------
        ValueError
            The cell is not built yet.

        Examples
        --------
        >>> import nblstm
        >>> cell = nblstm.LSTMCell(2, seed=0)
        >>> cell.build(3)
        >>> weights = cell.get_weights()
        >>> weights["kernel"].shape, weights["bias"].shape
        ((5, 8), (8,))
        >>> weights["bias"][:] = 1.0  # a copy: the cell keeps its zero bias
        >>> float(cell.get_weights()["bias"].sum())
        0.0
        """
        self._require_built()
        return {k: a.copy() for k, a in self._weights.items()}

    @accepts_any_array
    def set_weights(self, weights):
        """Replace the variables (builds the cell from ``kernel``'s shape when needed).

        Parameters
        ----------
        weights : dict, list or tuple
            ``{name: array}`` with exactly the names of :attr:`weight_names`;
            or the same variables under TensorFlow's scoped names, as
            TensorFlow prints them (``rnn/lstm_cell/kernel:0``,
            ``.../lstm_cell/projection/kernel:0``; ``:0`` optional), of one
            cell; or a list in the order of :attr:`weight_names`
            (TensorFlow's ``cell.get_weights()`` and ``cell.weights``).
            TensorFlow's shapes, and the cell's dtype (any supported float
            dtype when the cell has none yet). NumPy arrays, GPU arrays or
            objects with a ``numpy()`` method (TensorFlow variables); copied.

        Raises
        ------
        ValueError
            Missing or unexpected names, wrong shapes or count; the scoped
            names of several cells (a ``MultiRNNCell``'s: select one cell's with
            :func:`nblstm.porting.tf.select`).
        TypeError
            Not a dict or list, non-arrays, a dtype that is not the cell's.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(2)
        >>> cell.set_weights({"kernel": np.zeros((5, 8), np.float32), "bias": np.ones(8, np.float32)})
        >>> cell.built, cell.input_depth, cell.dtype
        (True, 3, dtype('float32'))
        >>> cell.set_weights({"rnn/lstm_cell/kernel:0": np.ones((5, 8), np.float32),   # TensorFlow's names
        ...                   "rnn/lstm_cell/bias:0": np.zeros(8, np.float32)})
        >>> cell.set_weights([np.ones((5, 8), np.float32), np.zeros(8, np.float32)])  # tf_cell.get_weights()
        >>> float(cell.get_weights()["kernel"].sum())
        40.0
        """
        weights, self.input_depth, self._dtype = checked_weights(
            weights, self.num_units, self.num_proj, self.use_peepholes, self.input_depth, self._dtype)
        self._set(weights)

    @property
    def variables(self):
        """Alias of :meth:`get_weights`.

        Examples
        --------
        >>> import nblstm
        >>> cell = nblstm.LSTMCell(2, use_peepholes=True)
        >>> cell.build(3)
        >>> list(cell.variables)
        ['kernel', 'bias', 'w_f_diag', 'w_i_diag', 'w_o_diag']
        """
        return self.get_weights()

    def _require_built(self):
        if self._weights is None:
            raise ValueError("the cell has no weights yet: call build(input_depth), set_weights(...) or the cell")

    def get_config(self):
        """Constructor arguments as a JSON-friendly dict (a callable initializer is recorded as ``None``).

        Examples
        --------
        >>> import nblstm
        >>> config = nblstm.LSTMCell(4, num_proj=2, seed=0).get_config()
        >>> config["num_units"], config["num_proj"], config["activation"], config["initializer"]
        (4, 2, 'tanh', 'glorot_uniform')
        >>> nblstm.LSTMCell(**config).get_config() == config
        True
        """
        return {
            "num_units": self.num_units, "use_peepholes": self.use_peepholes, "cell_clip": self.cell_clip,
            "initializer": self.initializer_name, "num_proj": self.num_proj, "proj_clip": self.proj_clip,
            "forget_bias": self.forget_bias, "state_is_tuple": self.state_is_tuple,
            "activation": self.activation.name, "name": self.name,
            "dtype": None if self._dtype is None else self._dtype.name, "seed": self.seed,
            "trainable": self.trainable, "recurrent_activation": self.recurrent_activation,
            "precision": self.precision,
        }

    def save(self, path):
        """Save the configuration and the weights in one ``.npz`` file.

        Parameters
        ----------
        path : str or os.PathLike
            NumPy adds ``.npz`` when it is missing.

        Examples
        --------
        >>> import os, tempfile
        >>> import nblstm
        >>> cell = nblstm.LSTMCell(2, seed=0)
        >>> cell.build(3)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     cell.save(os.path.join(tmp, "cell"))
        ...     sorted(os.listdir(tmp))
        ['cell.npz']
        """
        self._require_built()
        save(path, self.get_config(), self._weights)

    @classmethod
    def load(cls, path):
        """A cell saved by :meth:`save`, with its configuration and weights.

        Nothing in the file is run: its arrays are read without pickles
        (``allow_pickle=False``) and its configuration is JSON.

        Parameters
        ----------
        path : str or os.PathLike

        Raises
        ------
        ValueError, TypeError
            A file that is not one :meth:`save` wrote (empty, truncated,
            corrupt, another format) or whose configuration or weights are
            wrong; the message names the file.
        OSError
            A missing or unreadable file.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(2, num_proj=1, seed=0)
        >>> cell.build(3)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     cell.save(os.path.join(tmp, "cell.npz"))
        ...     loaded = nblstm.LSTMCell.load(os.path.join(tmp, "cell.npz"))
        >>> loaded.get_config() == cell.get_config()
        True
        >>> all(np.array_equal(a, loaded.get_weights()[k]) for k, a in cell.get_weights().items())
        True
        """
        config, weights = load(path)
        try:
            cell = cls(**config)
            cell.set_weights(weights)
        except (TypeError, ValueError) as e:  # the file's arguments or arrays are wrong: say which file
            raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{os.fspath(path)!r}: {e}") from None
        return cell

    # -- conversions -----------------------------------------------------------------------------------

    @classmethod
    def from_keras(cls, layer_or_weights, forget_bias=0.0, **kwargs):
        """A cell with the weights of a Keras ``LSTM`` layer (see :func:`nblstm.porting.keras.read`).

        Parameters
        ----------
        layer_or_weights : Keras LSTM layer, dict or list
            The layer (its ``units``, ``activation``, ``recurrent_activation``,
            ``use_bias`` and weights are read; ``stateful``, ``go_backwards``
            and options nblstm lacks are refused), its serialized form
            ``{"class_name": "LSTM", "config": ..., "weights": ...}``, or the
            bare ``layer.get_weights()``: ``[kernel [I, 4H], recurrent_kernel
            [H, 4H](, bias [4H])]`` (then ``activation`` and
            ``recurrent_activation`` are the caller's, Keras's defaults
            otherwise). A ``Bidirectional`` layer or a stack is refused: use
            ``nblstm.LSTM.from_keras``.
        forget_bias : float, default 0.0
            The new cell's ``forget_bias`` (Keras has none: 0 reproduces the layer exactly).
        **kwargs
            Further :class:`LSTMCell` arguments (``activation`` and
            ``recurrent_activation`` for a bare weight list; given with a
            layer they must agree with it).

        Raises
        ------
        ValueError
            What :func:`nblstm.porting.keras.read` refuses, a ``Bidirectional``
            layer or a stack, arguments that contradict the layer.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> rng = np.random.default_rng(0)
        >>> layer_weights = [rng.standard_normal((3, 8)), rng.standard_normal((2, 8)), np.zeros(8)]  # I = 3, H = 2
        >>> cell = nblstm.LSTMCell.from_keras(layer_weights)
        >>> cell.num_units, cell.input_depth, cell.dtype, cell.forget_bias
        (2, 3, dtype('float64'), 0.0)
        >>> layer = {"class_name": "LSTM", "weights": layer_weights,   # or a keras.layers.LSTM itself
        ...          "config": {"units": 2, "recurrent_activation": "hard_sigmoid"}}
        >>> nblstm.LSTMCell.from_keras(layer).recurrent_activation
        'hard_sigmoid'
        """
        from ..porting import _common, keras

        options, weights = keras.read_cell(layer_or_weights)
        return _common.new_cell(cls, options, weights, forget_bias, kwargs, "Keras layer")

    def to_keras(self):
        """Weights for a Keras ``LSTM`` layer (``unit_forget_bias=False``): ``[kernel, recurrent_kernel, bias]``.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(2, seed=0)
        >>> cell.build(3)
        >>> kernel, recurrent_kernel, bias = cell.to_keras()
        >>> kernel.shape, recurrent_kernel.shape, bias.shape
        ((3, 8), (2, 8), (8,))
        >>> back = nblstm.LSTMCell.from_keras([kernel, recurrent_kernel, bias])  # forget_bias folded into bias
        >>> x = np.ones((3, 1, 3), np.float32)  # [T, B, I]
        >>> np.allclose(back.run(x)[0], cell.run(x)[0])
        True
        """
        self._check_plain("Keras LSTM", allow_activation=True)
        return convert.lstmcell_to_keras(self.get_weights(), self.forget_bias)

    @classmethod
    def from_torch(cls, module_or_state_dict, layer=0, suffix="", forget_bias=0.0, **kwargs):
        """A cell with the weights of one layer of a PyTorch ``nn.LSTM`` (``proj_size`` becomes ``num_proj``).

        Parameters
        ----------
        module_or_state_dict : nn.LSTM or mapping
            The module (its ``state_dict()`` is read; also ``nn.LSTMCell`` or a
            module holding one LSTM) or a state dict of tensors or arrays
            (see :func:`nblstm.porting.torch.read`).
        layer : int, default 0
        suffix : {"", "_reverse"}, default ""
            ``"_reverse"``: the backward direction of a bidirectional ``nn.LSTM``.
        forget_bias : float, default 0.0
            The new cell's ``forget_bias`` (PyTorch has none).
        **kwargs
            Further :class:`LSTMCell` arguments (``activation`` and
            ``recurrent_activation`` must be PyTorch's tanh and sigmoid).

        Raises
        ------
        ValueError
            An ``nn.GRU`` or ``nn.RNN``, a ``layer`` or ``suffix`` the module
            lacks, malformed parameters.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> rng = np.random.default_rng(0)
        >>> state_dict = {"weight_ih_l0": rng.standard_normal((16, 3)),  # nn.LSTM(3, 4, proj_size=2)
        ...               "weight_hh_l0": rng.standard_normal((16, 2)),
        ...               "weight_hr_l0": rng.standard_normal((2, 4))}
        >>> cell = nblstm.LSTMCell.from_torch(state_dict)
        >>> cell.num_units, cell.num_proj, cell.input_depth
        (4, 2, 3)
        """
        from ..porting import _common, torch

        options, weights = torch.read_cell(module_or_state_dict, layer=layer, suffix=suffix)
        return _common.new_cell(cls, options, weights, forget_bias, kwargs, "nn.LSTM")

    def to_torch(self, layer=0, suffix=""):
        """A state dict of NumPy arrays for PyTorch ``nn.LSTM(I, H, proj_size=P or 0)``.

        Load with ``lstm.load_state_dict({k: torch.from_numpy(a) for k, a in cell.to_torch().items()})``.

        Parameters
        ----------
        layer : int, default 0
            The layer the keys name (``weight_ih_l{layer}...``).
        suffix : {"", "_reverse"}, default ""
            ``"_reverse"`` for the backward direction of a bidirectional ``nn.LSTM``.

        Raises
        ------
        ValueError
            Peepholes, ``cell_clip``, ``proj_clip``, a non-tanh activation or
            ``recurrent_activation='hard_sigmoid'``, none of which PyTorch has;
            a ``suffix`` other than ``""`` and ``"_reverse"``.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(4, num_proj=2, seed=0)
        >>> cell.build(3)
        >>> state_dict = cell.to_torch()
        >>> state_dict["weight_ih_l0"].shape, state_dict["weight_hh_l0"].shape, state_dict["weight_hr_l0"].shape
        ((16, 3), (16, 2), (2, 4))
        >>> back = nblstm.LSTMCell.from_torch(state_dict)  # forget_bias folded into bias_ih
        >>> x = np.ones((3, 1, 3), np.float32)  # [T, B, I]
        >>> np.allclose(back.run(x)[0], cell.run(x)[0])
        True
        """
        from ..porting import _common

        _common.check_suffix(suffix)
        layer = _common.check_layer_index("layer", layer)
        self._check_plain("PyTorch nn.LSTM", allow_activation=False)
        return convert.lstmcell_to_torch(self.get_weights(), self.forget_bias, layer=layer, suffix=suffix)

    def to_block_lstm(self):
        """Keyword arguments of :func:`nblstm.block_lstm` that compute this cell (tanh, no projection).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(2, seed=0, dtype=np.float64)
        >>> cell.build(3)
        >>> x = np.ones((3, 1, 3))  # [T, B, I]
        >>> c0, h0 = cell.zero_state(1, np.float64)
        >>> out = nblstm.block_lstm(x, c0, h0, **cell.to_block_lstm())
        >>> np.allclose(out.h, cell.run(x)[0])
        True
        """
        self._require_built()
        if self.activation.name != "tanh":
            raise ValueError("BlockLSTM has tanh only; this cell uses " + self.activation.name)
        return convert.lstmcell_to_block_lstm(self.get_weights(), self.forget_bias, self.cell_clip)

    def _check_plain(self, target, allow_activation):
        self._require_built()
        problems = []
        if self.use_peepholes:
            problems.append("peepholes")
        if self.cell_clip is not None:
            problems.append("cell_clip")
        if self.proj_clip is not None and self.num_proj is not None:
            problems.append("proj_clip")
        if target.startswith("Keras") and self.num_proj is not None:
            problems.append("num_proj")
        if not allow_activation and self.activation.name != "tanh":
            problems.append(f"activation {self.activation.name!r}")
        if not allow_activation and self.recurrent_activation != "sigmoid":
            problems.append(f"recurrent_activation {self.recurrent_activation!r}")
        if problems:
            raise ValueError(f"{target} has no equivalent of this cell's {', '.join(problems)}")

    # -- computation -----------------------------------------------------------------------------------

    @accepts_any_array
    def __call__(self, inputs, state, scope=None):
        """One step: ``output, new_state = cell(inputs, state)``.

        Parameters
        ----------
        inputs : [B, I] array
        state : LSTMStateTuple ``(c [B, H], h [B, P])`` or ``[B, H + P]`` array
            As :attr:`state_size` (``state_is_tuple``).
        scope : ignored
            TensorFlow's variable scope argument.

        Returns
        -------
        tuple
            ``(output [B, P], new_state)``, in the dtype and on the target
            (CPU or GPU) of ``inputs``.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(4, num_proj=2, seed=0)
        >>> x = np.ones((3, 5), np.float32)  # [B, I]
        >>> output, state = cell(x, cell.zero_state(3, np.float32))
        >>> output.shape, state.c.shape, state.h.shape
        ((3, 2), (3, 4), (3, 2))
        >>> np.array_equal(output, state.h)
        True
        """
        info = self._check_inputs(inputs, rank=2)
        outputs, final = self._run(info, inputs, state, None, with_grad=False)[:2]
        return outputs[0], final

    call = __call__

    def stepper(self, batch_size=1, initial_state=None):
        """The cell one step at a time, for streaming: ``step = cell.stepper(); h = step(x_t)``.

        The returned :class:`~nblstm.Stepper` packs the cell's
        weights once (a snapshot: a later :meth:`set_weights` needs a new
        stepper) and keeps the state ``(c, h)`` between calls, so that a
        step costs a check of ``x_t`` and one compiled kernel, a few
        microseconds for small cells, where ``cell(x_t, state)`` spends tens
        of microseconds validating and allocating. Its results are those of
        ``cell(x_t, state)`` (and of :meth:`run` one step at a time), bit for
        bit, with every option. CPU and NumPy arrays only.

        Parameters
        ----------
        batch_size : int, default 1
            ``B >= 1``, the rows of every step.
        initial_state : state, optional
            As :attr:`state_size`, ``[B, ...]`` rows of the cell's dtype
            (copied); zeros when omitted.

        Returns
        -------
        Stepper
            ``step(x_t)`` with ``x_t: [B, I]`` returns the output ``[B, P]``
            (a new array each call, or ``out=``); ``step.state`` is the
            current state, ``step.reset(state=None)`` starts again.

        Raises
        ------
        ValueError
            The cell has no weights yet (build it, set its weights or call it
            once first), ``batch_size`` below 1, a state of the wrong shape.
        TypeError
            A state that is not the cell's structure, dtype or a NumPy array.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(8, use_peepholes=True, cell_clip=3.0, seed=0)
        >>> cell.build(4)                                # I = 4
        >>> step = cell.stepper(batch_size=1)
        >>> chunks = np.random.default_rng(0).standard_normal((10, 1, 4)).astype(np.float32)
        >>> outputs = np.stack([step(x_t) for x_t in chunks])   # [T, B, H]
        >>> np.array_equal(outputs[-1], step.state.h)
        True
        >>> outputs_at_once, final = cell.run(chunks)    # the whole sequence in one call
        >>> np.allclose(outputs, outputs_at_once, atol=1e-6)
        True
        """
        if self._weights is None:
            raise ValueError("stepper() needs the cell's weights: call build(input_depth), set_weights(...) or "
                             "the cell once first")
        batch = v.check_batch_size(batch_size)
        if batch < 1:
            raise ValueError(f"batch_size must be >= 1 for a stepper, got {batch}")
        check_precision("host", self.precision)
        return Stepper(target_for("host"), self._weights, self._options(), batch, initial_state, self.state_is_tuple)

    @accepts_any_array
    def run(self, inputs, initial_state=None, sequence_length=None, *, mask=None, reverse=False, time_major=True,
            zero_output_for_mask=False):
        """The cell over a whole sequence in fused kernels (``tf.compat.v1.nn.dynamic_rnn``).

        Parameters
        ----------
        inputs : [T, B, I] array
            Time-major; ``[B, T, I]`` with ``time_major=False``.
        initial_state : state, optional
            As :attr:`state_size`; zeros when omitted.
        sequence_length : [B] ints, optional
            Per-example lengths in ``[0, T]`` (default ``T``). Past its length
            an example's outputs are zero and its state is carried unchanged,
            so the final state is the state at its length.
        mask : [B, T] bools, optional
            Keras's mask (batch first, whatever ``time_major``), any pattern,
            instead of ``sequence_length``: a masked step carries the state
            and its output repeats the previous output (zeros before the
            first computed step).
        reverse : bool, default False
            Run each example backwards: within its own length (the
            backward direction of ``bidirectional_dynamic_rnn``), or over
            its unmasked steps last to first. The outputs stay in time
            order. Nothing is copied: the kernels read the steps in that order.
        time_major : bool, default True
            ``False``: ``inputs`` and the outputs are batch-major,
            ``[B, T, ...]`` (TensorFlow's ``dynamic_rnn`` default; a copy).
            The cell cannot tell ``[B, T, I]`` from ``[T, B, I]``: say which.
        zero_output_for_mask : bool, default False
            With ``mask``: masked steps output zeros (Keras's option of that
            name, set by its ``Bidirectional``) instead of repeating the last output.

        Returns
        -------
        tuple
            ``(outputs [T, B, P], final_state)`` (``[B, T, P]`` with ``time_major=False``).

        Raises
        ------
        TypeError, ValueError
            Wrong types, ranks, shapes, dtypes, lengths outside ``[0, T]``, a
            mask with lengths; a state, lengths or mask sized for the other
            layout of ``inputs`` (the message says to pass ``time_major``).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(3, seed=0)
        >>> x = np.ones((3, 2, 4), np.float32)  # [T, B, I]
        >>> outputs, final = cell.run(x, sequence_length=[3, 1])
        >>> outputs.shape, final.c.shape, final.h.shape
        ((3, 2, 3), (2, 3), (2, 3))
        >>> np.array_equal(final.h[1], outputs[0, 1])  # example 1 stops after one step
        True
        >>> state = cell.zero_state(2, np.float32)
        >>> for t in range(3):  # the same as calling the cell step by step
        ...     output, state = cell(x[t], state)
        >>> np.allclose(output[0], outputs[-1, 0])
        True
        """
        return self._sequence(inputs, initial_state, sequence_length, mask, reverse, time_major, zero_output_for_mask,
                              with_grad=False)[:2]

    @accepts_any_array
    def vjp(self, inputs, initial_state=None, sequence_length=None, *, mask=None, reverse=False, time_major=True,
            zero_output_for_mask=False):
        """Forward over a sequence, and a function giving its vector-Jacobian product.

        Parameters
        ----------
        inputs, initial_state, sequence_length, mask, reverse, time_major, zero_output_for_mask
            As :meth:`run`; ``d_outputs`` and ``d_inputs`` follow ``time_major``.

        Returns
        -------
        tuple
            ``((outputs, final_state), backward)``: ``backward(d_outputs=None,
            d_final_state=None)`` returns ``(d_inputs [T, B, I],
            d_initial_state, d_weights)``, ``d_weights`` keyed like
            :meth:`get_weights`. ``d_outputs`` is ``[T, B, P]`` (gradients
            past an example's length are ignored: those outputs are constant
            zero); ``d_final_state`` has the state's structure, ``None`` for
            zeros (also for either part of a tuple). Clipping has its true
            gradient (zero where clipped).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(3, seed=1, dtype=np.float64)
        >>> x = np.ones((4, 2, 2))
        >>> (out, state), backward = cell.vjp(x)
        >>> d_x, d_state, d_w = backward(np.ones_like(out))
        >>> d_x.shape, sorted(d_w)
        ((4, 2, 2), ['bias', 'kernel'])
        """
        outputs, final, ctx = self._sequence(inputs, initial_state, sequence_length, mask, reverse, time_major,
                                             zero_output_for_mask, with_grad=True)

        def backward(d_outputs=None, d_final_state=None):
            """Gradients of the loss with respect to the inputs, the initial state and the weights."""
            if not time_major and d_outputs is not None:
                d_outputs = swap01(d_outputs, ctx["kind"]) if len(v.describe_array(
                    "d_outputs", d_outputs).shape) == 3 else d_outputs
            d_x, d_state, d_w = self._backward(ctx, d_outputs, d_final_state)
            return (d_x if time_major else swap01(d_x, ctx["kind"])), d_state, d_w

        return (outputs, final), backward

    def _sequence(self, inputs, initial_state, sequence_length, mask, reverse, time_major, zero_masked, with_grad):
        """:meth:`run` and :meth:`vjp`: the layout, the mask and the direction checked, then :meth:`_run`."""
        time_major = v.check_bool("time_major", time_major)
        reverse = v.check_bool("reverse", reverse)
        zero_masked = v.check_bool("zero_output_for_mask", zero_masked)
        info = self._check_inputs(inputs, rank=3)
        v.check_sequence_layout(initial_state, sequence_length, tuple(info.shape), time_major, mask)
        if not time_major:
            inputs = swap01(inputs, info.kind)
            info = v.describe_array("inputs", inputs)
        steps, batch = info.shape[0], info.shape[1]
        if mask is not None:
            if sequence_length is not None:
                raise ValueError("pass sequence_length or mask, not both")
            mask = v.check_mask(mask, steps, batch)
        outputs, final, ctx = self._run(info, inputs, initial_state, sequence_length, with_grad, mask=mask,
                                        reverse=reverse, zero_masked=zero_masked)
        if not time_major:
            outputs = swap01(outputs, info.kind)
        return outputs, final, ctx

    # -- internals -------------------------------------------------------------------------------------

    def _check_inputs(self, inputs, rank):
        info = v.describe_array("inputs", inputs)
        meaning = "[B, I]" if rank == 2 else "[T, B, I]"
        if len(info.shape) != rank:
            raise ValueError(f"inputs must have rank {rank} {meaning}, got shape {tuple(info.shape)}")
        if info.dtype not in v.SUPPORTED_DTYPES:
            raise TypeError(f"inputs has dtype {info.dtype}; expected float16, float32 or float64")
        if self._dtype is not None and info.dtype != self._dtype:
            raise TypeError(f"inputs has dtype {info.dtype}; expected {self._dtype} (the cell's dtype)")
        depth = info.shape[-1]
        if depth == 0:
            raise ValueError(f"inputs has shape {tuple(info.shape)}: the input depth I = inputs.shape[-1] must be > 0")
        if self.input_depth is not None and depth != self.input_depth:
            raise ValueError(f"inputs has shape {tuple(info.shape)}; expected input depth {self.input_depth} "
                             f"(the cell's kernel is [{self.input_depth} + {self._depth}, {4 * self.num_units}])")
        return info

    def _state_arrays(self, state, batch, dtype, kind, name):
        """``(c [B, H], h [B, P])`` of a state argument (:func:`nblstm.cell.state.state_arrays`)."""
        return state_arrays(state, batch, dtype, kind, name, self.num_units, self._depth, self.state_is_tuple)

    def _like(self, state, kind):
        """``state`` moved to the GPU when ``kind`` is ``"device"``."""
        if kind == "host":
            return state
        if isinstance(state, tuple):
            return LSTMStateTuple(*(v.to_device(a) for a in state))
        return v.to_device(state)

    def _options(self):
        """The cell's options as the record the targets take."""
        proj_clip = self.proj_clip if self.num_proj is not None else None
        return CellOptions(self.forget_bias, self.cell_clip, proj_clip, self.activation.code,
                           GATE_FUNCTIONS.index(self.recurrent_activation), self.precision)

    def _structured(self, state):
        """A target's state ``(c, h)`` as an :class:`LSTMStateTuple` (a joined state stays one array)."""
        return LSTMStateTuple(*state) if self.state_is_tuple else state

    def _run(self, info, inputs, state, sequence_length, with_grad, mask=None, reverse=False, zero_masked=False):
        """Validate everything, then run the forward kernels; returns ``(outputs, final_state, ctx)``.

        ``mask`` (a validated ``[B, T]`` bool array, or ``None``) and
        ``reverse`` choose the order of the steps (:mod:`nblstm.schedule`).
        """
        dtype = info.dtype
        batch = info.shape[-2]
        steps = 1 if len(info.shape) == 2 else info.shape[0]
        c0, h0 = self._state_arrays(state, batch, dtype, info.kind, "state" if len(info.shape) == 2
                                    else "initial_state")
        lengths = v.check_lengths(sequence_length, steps, batch)
        # An inference call on the CPU runs the examples longest first, where the kernels skip those that have
        # finished (schedule.by_length), and puts them back: the same bits. A training call keeps the order (its
        # weight gradients sum over the examples in it).
        rows = None
        if (not with_grad and sequence_length is not None and len(info.shape) == 3 and info.kind == "host"
                and skips_sorted_rows(self, steps, batch, info.shape[-1], info.dtype)):
            rows = by_length(lengths)
        if rows is not None:
            inputs, lengths = np.take(inputs, rows, axis=1), lengths[rows]
            c0, h0 = (None if a is None else np.take(a, rows, axis=0) for a in (c0, h0))
            info = v.describe_array("inputs", inputs)
        order = schedule(steps, batch, lengths, mask, reverse, zero_masked)
        outputs, final, ctx = self._launch(info, inputs, c0, h0, lengths, order, with_grad)
        if rows is not None:
            back = np.argsort(rows)
            outputs = np.take(outputs, back, axis=1)
            final = LSTMStateTuple(final.c[back], final.h[back]) if self.state_is_tuple else final[back]
        return outputs, final, ctx

    def _launch(self, info, inputs, c0, h0, lengths, order, with_grad):
        """The forward kernels on validated arguments: ``(outputs, final_state, ctx)``."""
        dtype = info.dtype
        batch = info.shape[-2]
        steps = 1 if len(info.shape) == 2 else info.shape[0]
        if self._weights is None:
            if self._dtype is None:
                self._dtype = dtype
            self.build(info.shape[-1])
        check_precision(info.kind, self.precision)
        target = target_for(info.kind)
        outputs, final, saved = target.cell_forward(
            inputs=inputs, c0=c0, h0=h0, weights=self._weights, cache=self._target_cache, lengths=lengths,
            options=self._options(), join_state=not self.state_is_tuple, with_grad=with_grad, schedule=order)
        ctx = None
        if with_grad:
            ctx = {"saved": saved, "target": target, "dtype": dtype, "kind": info.kind, "shape": (steps, batch)}
        return outputs, self._structured(final), ctx

    def _grad_part(self, value, shape, dtype, kind, name):
        """A validated gradient argument (``None`` stays ``None``: zeros)."""
        if value is None:
            return None
        info = v.describe_array(name, value)
        if info.kind != kind:
            raise TypeError(f"{name} must live where inputs did (NumPy or GPU)")
        if info.dtype != dtype:
            raise TypeError(f"{name} has dtype {info.dtype}; expected {dtype} (the dtype of inputs)")
        v.check_shape(info, shape, "like the corresponding state")
        return value

    def _backward(self, ctx, d_outputs, d_final_state):
        steps, batch = ctx["shape"]
        dtype, kind = ctx["dtype"], ctx["kind"]
        units, depth = self.num_units, self._depth
        d_out = self._grad_part(d_outputs, (steps, batch, depth), dtype, kind, "d_outputs")
        if d_final_state is None:
            d_c = d_h = None
        elif self.state_is_tuple:
            if not isinstance(d_final_state, (tuple, list)) or len(d_final_state) != 2:
                raise TypeError("d_final_state must be a pair (d_c [B, H], d_h [B, P]) with state_is_tuple=True")
            d_c, d_h = d_final_state
        else:
            d_c, d_h = self._state_arrays(d_final_state, batch, dtype, kind, "d_final_state")
        d_c = self._grad_part(d_c, (batch, units), dtype, kind, "d_final_state.c")
        d_h = self._grad_part(d_h, (batch, depth), dtype, kind, "d_final_state.h")
        return self._launch_backward(ctx, d_out, d_c, d_h)

    def _launch_backward(self, ctx, d_out, d_c, d_h):
        """The backward kernels on validated gradients (``None``: zeros)."""
        dtype = ctx["dtype"]
        d_x, d_state, d_w = ctx["target"].cell_backward(saved=ctx["saved"], d_outputs=d_out, d_c=d_c, d_h=d_h,
                                                        join_state=not self.state_is_tuple)
        # Weight gradients are NumPy arrays of the cell's dtype on both targets, like get_weights().
        d_w = {n: d_w[n].astype(dtype, copy=False) for n in self.weight_names}
        return d_x, self._structured(d_state), d_w

    def __getstate__(self):
        """The state to pickle (or copy): everything but the targets' caches of packed or device weights.

        A cell sent to another process (a Dask worker) or copied packs its
        weights again on first use there; GPU arrays never travel.
        """
        return {**self.__dict__, "_target_cache": {}}

    def __repr__(self):
        extras = [f"num_proj={self.num_proj}"] if self.num_proj else []
        if self.use_peepholes:
            extras.append("use_peepholes=True")
        if self.cell_clip is not None:
            extras.append(f"cell_clip={self.cell_clip}")
        if self.activation.name != "tanh":
            extras.append(f"activation={self.activation.name!r}")
        if self.recurrent_activation != "sigmoid":
            extras.append(f"recurrent_activation={self.recurrent_activation!r}")
        return f"LSTMCell({', '.join([str(self.num_units), *extras])})"


# -- the layers' path: arguments checked once per call of the layer ---------------------------------------------


def set_checked_weights(cell, checked):
    """:meth:`LSTMCell.set_weights` with what :func:`nblstm.cell.weights.checked_weights` returned for ``cell``.

    ``checked``: ``(weights, input_depth, dtype)``, the weights being the
    check's own copies (or arrays the caller made for the cell:
    ``LSTM.set_cell_weights(copy=False)``). For :class:`nblstm.LSTM`, which checks every cell's
    weights before it replaces any: checked once, not again (``nblstm.torch.LSTM``
    sets its layer's weights at every step).
    """
    weights, cell.input_depth, cell._dtype = checked
    cell._set(weights)


def skips_sorted_rows(cell, steps, batch, inputs, dtype):
    """Whether an inference call of ``cell`` on the CPU gains by its examples sorted longest first, with the same
    bits (:func:`nblstm.cpu.cell.skips_sorted_rows`): ``inputs`` its input depth, ``dtype`` the inputs'."""
    from ..cpu.cell import skips_sorted_rows as cpu_skips

    return cpu_skips(cell._options(), cell.num_proj is not None, steps, batch, inputs, cell.num_units, np.dtype(dtype))


def checked_forward(cell, info, inputs, state, lengths, order, with_grad):
    """``cell`` over arguments its caller has checked: ``(outputs, final_state, ctx)``, as :meth:`LSTMCell.vjp`.

    For :class:`nblstm.LSTM`, which checks its input, states, lengths and
    mask once per call and builds one schedule per direction for all its
    cells, instead of every cell checking them again.

    Parameters
    ----------
    info : nblstm._validate.ArrayInfo
        ``describe_array`` of ``inputs``.
    inputs : [T, B, I] array
        Time-major, of the cell's dtype and input depth.
    state : tuple or None
        ``(c0 [B, H], h0 [B, P])`` arrays of ``inputs``' kind and dtype, or ``None`` (zeros).
    lengths : [B] int64 array
        From :func:`nblstm._validate.check_lengths`.
    order : nblstm.schedule.Schedule or None
        :func:`nblstm.schedule.schedule` of ``lengths``, the mask and the direction.
    with_grad : bool
        Keep what :func:`checked_backward` needs in ``ctx``.
    """
    c0, h0 = (None, None) if state is None else state
    return cell._launch(info, inputs, c0, h0, lengths, order, with_grad)


def checked_backward(cell, ctx, d_outputs, d_state):
    """The gradients of a :func:`checked_forward`: ``(d_inputs, d_initial_state, d_weights)``.

    ``d_outputs [T, B, P]`` and ``d_state`` ``(d_c [B, H], d_h [B, P])`` (each
    part, or all of it, ``None`` for zeros) checked by the caller.
    """
    d_c, d_h = (None, None) if d_state is None else d_state
    return cell._launch_backward(ctx, d_outputs, d_c, d_h)
