"""The command line and what it runs: the demo, the checks, the GPU check and bench, the warm-up.

``python -m nblstm`` (:mod:`nblstm.__main__`) delegates to :func:`nblstm._tools.cli.main`.
"""

__all__ = []
