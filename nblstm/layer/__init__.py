"""Layers over :class:`nblstm.LSTMCell`: :class:`LSTM` (``torch.nn.LSTM``'s API) and TensorFlow 1's RNN functions."""
