"""Whole layers of other frameworks as ``nblstm.LSTM`` keywords and cell weights, and back.

Each reader returns ``(config, cells)``: ``config`` the keyword arguments of
``nblstm.LSTM`` (``input_size, hidden_size, num_layers, bias, batch_first,
dropout, bidirectional, proj_size, use_peepholes, cell_clip, proj_clip,
forget_bias, activation, recurrent_activation, dtype``), ``cells`` one dict
of cell weights per layer and direction, index ``layer * D + direction``
(``D = 2`` when bidirectional), in :class:`nblstm.LSTMCell`'s layout
(``kernel [I_k + P, 4H]`` with gate blocks ``i, c, f, o``, ``bias [4H]``,
optional ``w_f_diag, w_i_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``;
``I_0 = input_size``, ``I_k = D * P`` above). The weights are for
``config["forget_bias"]``: 0, the frameworks having none (an
:class:`nblstm.torch.LSTM` has its own), in the source's dtype.

- :mod:`nblstm.porting.torch`: ``torch.nn.LSTM`` modules and state dicts (``read``, ``write``);
- :mod:`nblstm.porting.keras`: Keras ``LSTM`` and ``Bidirectional(LSTM)`` layers, models and stacks
  (``read``, ``write``);
- :mod:`nblstm.porting.onnx`: ONNX ``LSTM`` nodes (``read``; needs the ``onnx`` package);
- :mod:`nblstm.porting.tf`: TensorFlow's variable names and order for :meth:`nblstm.LSTMCell.set_weights`.

No framework is imported by nblstm: modules, layers and protos are read
through their attributes.

Examples
--------
>>> import numpy as np
>>> from nblstm import porting
>>> rng = np.random.default_rng(0)
>>> state_dict = {"weight_ih_l0": rng.standard_normal((8, 3)), "weight_hh_l0": rng.standard_normal((8, 2)),
...               "bias_ih_l0": rng.standard_normal(8), "bias_hh_l0": rng.standard_normal(8)}  # nn.LSTM(3, 2)
>>> config, cells = porting.torch.read(state_dict)
>>> config["input_size"], config["hidden_size"], config["num_layers"], [sorted(c) for c in cells]
(3, 2, 1, [['bias', 'kernel']])
>>> back = porting.torch.write(config, cells)
>>> all(np.allclose(back[k], state_dict[k]) for k in ("weight_ih_l0", "weight_hh_l0"))
True
"""

from . import keras, onnx, tf, torch

__all__ = ["keras", "onnx", "tf", "torch"]
