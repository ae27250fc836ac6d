"""The TF1 ``LSTMCell`` facade: the cell (:mod:`~nblstm.cell.cell`), its activations and initializers.

The cell validates its arguments, keeps its weights on the host and runs on
the target of its inputs through the target contract
(:class:`nblstm._contract.Target`), as the ops do.
"""

from .activations import ACTIVATION_NAMES, Activation
from .cell import LSTMCell, LSTMStateTuple
from .initializers import INITIALIZER_NAMES

__all__ = ["ACTIVATION_NAMES", "INITIALIZER_NAMES", "Activation", "LSTMCell", "LSTMStateTuple"]
