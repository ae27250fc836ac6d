"""``python -m nblstm {demo,check,bench,info,warmup}``: the command line (:mod:`nblstm._tools.cli`)."""

import sys

from ._tools.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
