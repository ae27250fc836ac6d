"""Start-up cost of nblstm: cold and warm ``import nblstm`` plus a first call, next to ``import numba``.

Every case runs in a fresh interpreter, the cases interleaved round after
round, and the report gives the median wall time of each (process start to
exit). "Cold" runs point numba at an empty cache folder, as the first
program run after installing does, so they include the JIT compilation of every
kernel the call needs; "warm" runs share one cache folder filled by a first
run, as every later run does.

Run it with the interpreter whose nblstm is to be timed::

    python asv_bench/startup_report.py --rounds 5

It writes ``docs/startup.md`` (``--markdown`` to change) and prints it.
"""

import argparse
import datetime
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "asv_bench"))

from benchmarks.bench_startup import _CELL_CALLS, _FIRST_CALLS, _GRAD  # noqa: E402 - the same first calls as asv times
from peer_compare import _machine  # noqa: E402

_FORWARD = _FIRST_CALLS.format(grad="")  # import nblstm, then a tiny float32 forward
_FORWARD_BACKWARD = _FIRST_CALLS.format(grad=_GRAD)

#: The floor under a warm first call: numba itself loading one cached ``@njit`` function and calling it. Written
#: to a module of the run's folder, the working directory of every case (numba caches only functions defined in a file).
_FLOOR_MODULE = """
import numba
import numpy


@numba.njit(cache=True)
def total(a):
    return a.sum()


total(numpy.ones(3))
"""
_FLOOR = "import nblstm_startup_floor"

#: (label, code, numba cache: None, "warm" or "cold")
CASES = (
    ("Python alone", "pass", None),
    ("`import numpy`", "import numpy", None),
    ("`import numba`", "import numba", None),
    ("numba alone: one tiny cached `@njit` function loaded and called, warm cache (the floor)", _FLOOR, "warm"),
    ("numba alone: the same function compiled, cold cache", _FLOOR, "cold"),
    ("`import nblstm`", "import nblstm", "warm"),
    ("`import nblstm` + first forward, warm cache", _FORWARD, "warm"),
    ("`import nblstm` + first forward and backward, warm cache", _FORWARD_BACKWARD, "warm"),
    ("`import nblstm` + `nblstm.warmup()`, warm cache", "import nblstm\nnblstm.warmup()", "warm"),
    ("`import nblstm` + first forward, cold cache (JIT compile)", _FORWARD, "cold"),
    ("`import nblstm` + first forward and backward, cold cache (JIT compile)", _FORWARD_BACKWARD, "cold"),
    ("`import nblstm` + `LSTMCell` run, `vjp` and backward, warm cache", _CELL_CALLS, "warm"),
    ("`import nblstm` + `LSTMCell` run, `vjp` and backward, cold cache (JIT compile)", _CELL_CALLS, "cold"),
    ("both in one process: the ops' forward and backward, then the `LSTMCell` calls, cold cache",
     _FORWARD_BACKWARD + _CELL_CALLS, "cold"),
    ("`nblstm.warmup(jobs=1)`, cold cache (every kernel, float32 and float64)",
     "import nblstm\nnblstm.warmup(jobs=1)", "cold"),
    ("`nblstm.warmup(jobs=2)`, cold cache (every kernel, float32 and float64)",
     "import nblstm\nnblstm.warmup(jobs=2)", "cold"),
    ("`python -m nblstm demo`, cold cache", "import runpy, sys\nsys.argv = ['nblstm', 'demo']\n"
     "runpy.run_module('nblstm', run_name='__main__')", "cold"),
)


def _run(python, code, cache_dir, cwd):
    """Wall seconds of ``python -c code`` in the folder ``cwd``, with ``NUMBA_CACHE_DIR=cache_dir`` (unset when
    ``None``)."""
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    start = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(python, rounds):
    """``{label: [seconds per round]}``, the cases interleaved in each round."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="nblstm-startup-"))
    try:
        warm = str(work / "warm")
        (work / "nblstm_startup_floor.py").write_text(_FLOOR_MODULE)
        # Fill the shared cache with everything the warm cases load.
        _run(python, _FORWARD_BACKWARD + "nblstm.warmup()\n", warm, work)
        _run(python, _FLOOR, warm, work)
        times = {label: [] for label, _, _ in CASES}
        for r in range(rounds):
            for k, (label, code, cache) in enumerate(CASES):
                if cache == "cold":
                    folder = work / f"cold-{r}-{k}"
                    times[label].append(_run(python, code, str(folder), work))
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    times[label].append(_run(python, code, warm if cache == "warm" else None, work))
        return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _versions(python):
    code = "import sys, numba, numpy, nblstm; print(nblstm.__version__, numba.__version__, numpy.__version__)"
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return {"nblstm": out[0], "numba": out[1], "numpy": out[2], "python": platform.python_version()}


def markdown(times, versions, rounds):
    """The Markdown report."""
    numba_alone = statistics.median(times["`import numba`"])
    lines = [
        "# Start-up: cold and warm import and first call",
        "",
        f"Generated by `asv_bench/startup_report.py` on {datetime.date.today().isoformat()}: {_machine()}.",
        f"nblstm {versions['nblstm']}, numba {versions['numba']}, NumPy {versions['numpy']}, "
        f"Python {versions['python']}.",
        "",
        f"Wall time of a fresh interpreter running each line (process start to exit), median of {rounds} "
        "interleaved rounds. **Warm**: numba's on-disk cache holds the compiled kernels (every run after "
        "the first). **Cold**: an empty cache, so the kernels the call needs are compiled (the first run "
        "after installing; `nblstm.warmup()` moves this cost to a moment of the user's choosing). The first "
        "call is a tiny float32 problem, so the time is start-up, not compute.",
        "",
        "| case | median s | min s | max s | / `import numba` |",
        "|---|---|---|---|---|",
    ]
    for label, _, _ in CASES:
        t = times[label]
        lines.append(f"| {label} | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} | "
                     f"{statistics.median(t) / numba_alone:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter whose nblstm is timed")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "startup.md"), help="output file ('' for none)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    times = measure(args.python, args.rounds)
    report = markdown(times, _versions(args.python), args.rounds)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
