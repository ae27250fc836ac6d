#!/usr/bin/env python3
"""nblstm's CUDA target against cuDNN on one NVIDIA GPU: timings, accuracy, kernel profile and sanitizer runs.

Run from the repository root, on the GPU machine (one process; about 7.5 minutes at most on an H200)::

    PYTHONPATH=. python3 scripts/gpu_bench.py --out DIR

Everything goes to stdout and into DIR: one Markdown file per section
(``env.md``, ``ceilings.md``, ``compare.md``, ``profile.md``,
``sanitize.md``), ``report.md`` (all of them, in order), ``profile.txt``
(PyTorch's kernel tables), the sanitizers' logs and ``results.json`` (every
number, note and error; rewritten after each section, so a run stopped
early keeps what it measured).

Sections (``--sections``; each has a time budget, and one that fails
records its error and the next runs):

env
    Versions, the GPU (name, SMs, L2, clocks), PyTorch's TF32 flags, the
    cuBLAS binding nblstm calls and its CUDA switches.
ceilings
    A large device-to-device copy (GB/s, read + write) and an 8192^3 float32
    matmul through PyTorch with TF32 off and on (TFLOP/s).
compare
    nblstm against ``torch.nn.LSTM`` (cuDNN) with the same weights, float32,
    shapes ``(T, B, I, H)`` of :data:`SHAPES`: forward, and forward +
    backward (``block_lstm_grad`` with ``h_grad`` ones against
    ``y.backward(ones)``). cuDNN runs with TF32 off and on; nblstm with
    ``precision="exact"`` (the default) and ``"tf32"``, as configured and
    with each time loop forced (:data:`LOOP_SETTINGS`; which loop each run
    took is read from ``nblstm.cuda.launch.LOOPS``). CUDA-event medians
    after warm-up, ratios nblstm / cuDNN against the targets of
    :data:`TARGETS`, the largest errors of ``h``, the final ``c`` and the
    gradients against cuDNN with TF32 off.
profile
    One forward + backward per shape under ``torch.profiler``: the 12
    kernels that took the most GPU time, for nblstm and for cuDNN.
sanitize
    ``compute-sanitizer`` memcheck, racecheck and synccheck (concurrently,
    each with a timeout) on a child process of this script
    (``--sanitize-case``) that runs the ops and ``LSTMCell`` on small shapes
    with every loop variant and precision, checked against the CPU target.

``--quick`` runs one shape with few repetitions. ``--sim-smoke`` runs the
nblstm paths on a tiny shape with Numba device arrays (no PyTorch), in the
CUDA simulator too (``NUMBA_ENABLE_CUDASIM=1``): the test of this script.
The functions that need no GPU (tables, targets, variants, parsing) import
without one.
"""

import argparse
import contextlib
import datetime
import faulthandler
import functools
import importlib
import importlib.metadata
import inspect
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

SECTIONS = ("env", "ceilings", "compare", "profile", "sanitize")
# Seconds each section may start new work for, and the least it needs to start at all.
BUDGET_S = {"env": 20, "ceilings": 30, "compare": 215, "profile": 40, "sanitize": 150}
MIN_S = {"env": 5, "ceilings": 10, "compare": 30, "profile": 10, "sanitize": 45}
# The whole run: sections stop starting work here; a watchdog ends the process TOTAL_GRACE_S later.
TOTAL_BUDGET_S = 445
TOTAL_GRACE_S = 25

SHAPES = ((25, 1, 512, 512), (25, 4, 1024, 1024), (25, 64, 1024, 1024), (100, 64, 512, 512), (50, 256, 1024, 1024))
QUICK_SHAPES = ((25, 4, 1024, 1024),)
SMOKE_SHAPES = ((2, 1, 3, 4),)
# Targets of the time ratio nblstm / cuDNN (at most): precision "exact" against cuDNN with TF32 off,
# precision "tf32" against cuDNN with TF32 on (PyTorch's default for cuDNN).
TARGETS = {
    (25, 1, 512, 512): {"exact": 0.7, "tf32": 0.7},
    (25, 4, 1024, 1024): {"exact": 0.7, "tf32": 0.7},
    (25, 64, 1024, 1024): {"exact": 1.0, "tf32": 1.0},
    (100, 64, 512, 512): {"exact": 1.0, "tf32": 1.0},
    (50, 256, 1024, 1024): {"exact": 1.2, "tf32": 1.1},
}
PRECISIONS = ("exact", "tf32")
# cuDNN runs against which each precision of nblstm is held.
TARGET_REFERENCE = {"exact": "off", "tf32": "on"}
# Sanitizer child: (T, B, I, H) shapes, each with every time loop forced; B = 33 spans three groups of rows of
# the resident kernels.
SANITIZE_SHAPES = ((3, 1, 7, 40), (3, 5, 7, 40), (3, 33, 7, 40))
SANITIZE_QUICK_SHAPES = ((3, 1, 7, 40), (3, 33, 7, 40))
SANITIZE_SMOKE_SHAPES = ((2, 1, 3, 4),)
SANITIZE_TOOLS = ("memcheck", "racecheck", "synccheck")
SANITIZE_TIMEOUT_S = 150
SANITIZER_EXIT = 99  # --error-exitcode: the sanitizer found errors


# -- formatting -----------------------------------------------------------------------------------------------------

def fmt_ms(x):
    """Milliseconds with 3 significant digits; ``-`` for a missing value."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_ratio(x):
    return "-" if x is None else f"{x:.2f}"


def fmt_err(x):
    return "-" if x is None else f"{x:.1e}"


def ratio(a, b):
    """``a / b`` or ``None`` when either is missing (or ``b`` is not positive)."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def shape_label(shape):
    return ",".join(str(d) for d in shape)


def markdown_table(headers, rows):
    """A GitHub/MyST Markdown table; cells are converted with ``str``."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(headers, rows):
    """The same table as aligned plain text."""
    cells = [list(map(str, headers))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def parse_shapes(text):
    """``"25,1,512,512;25,4,1024,1024"`` -> ``((25, 1, 512, 512), (25, 4, 1024, 1024))``."""
    shapes = []
    for part in text.replace(" ", "").split(";"):
        if part:
            dims = tuple(int(d) for d in part.split(","))
            if len(dims) != 4 or min(dims) < 1:
                raise argparse.ArgumentTypeError(f"a shape is T,B,I,H with positive sizes, got {part!r}")
            shapes.append(dims)
    if not shapes:
        raise argparse.ArgumentTypeError("no shape given")
    return tuple(shapes)


def parse_sections(text):
    names = tuple(s for s in text.replace(" ", "").split(",") if s)
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    return names


def verdict(value, target):
    """``"met"`` when ``value <= target``, ``"unmet"`` otherwise, ``"n/a"`` when either is missing."""
    if value is None or target is None:
        return "n/a"
    return "met" if value <= target else "unmet"


def median_stats(samples):
    """``{"median_ms", "min_ms", "reps", "samples_ms"}`` of a list of milliseconds."""
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "reps": len(samples),
            "samples_ms": [round(s, 5) for s in samples]}


def reps_for(probe_ms, target_s, min_reps, max_reps, left_s=None):
    """How many repetitions fill ``target_s`` (at most half the ``left_s`` seconds left), within the bounds."""
    probe_ms = max(probe_ms, 1e-3)
    reps = int(target_s * 1e3 / probe_ms)
    if left_s is not None:
        reps = min(reps, int(max(left_s, 0) * 1e3 / probe_ms / 2))
    return max(min_reps, min(max_reps, reps))


def summary_lines(text):
    """The ``... SUMMARY: ...`` lines of a compute-sanitizer log."""
    return [line.strip() for line in text.splitlines() if re.search(r"\bSUMMARY\b", line)]


def sanitizer_errors(text):
    """The error count of the ``ERROR SUMMARY`` line, or ``None`` when there is none."""
    found = re.findall(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    return int(found[-1]) if found else None


# -- nblstm's switches ----------------------------------------------------------------------------------------------

#: The time loops of the fused ops (nblstm.cuda.launch.Launcher.recurrence), each forced by its switches.
LOOP_SETTINGS = (
    ("resident", {"PERSISTENT": True, "RESIDENT": "auto"}),
    ("gemm-steps", {"PERSISTENT": False, "STEP_GEMM": True}),
    ("tiled persistent", {"PERSISTENT": True, "RESIDENT": False, "STEP_GEMM": False}),
    ("tiled per-step", {"PERSISTENT": False, "STEP_GEMM": False}),
)


def loop_variants(config, batch):
    """``[(label, settings)]`` of the loop variants to time at this batch size.

    ``"default"`` (the configuration as it is, ``{}``) always, then each
    loop of :data:`LOOP_SETTINGS` whose switches the configuration has. The
    tiled persistent loop only takes batches up to ``PERSISTENT_MAX_BATCH``.
    Which loop a run took is read from ``nblstm.cuda.launch.LOOPS``.
    """
    variants = [("default", {})]
    for label, settings in LOOP_SETTINGS:
        if not all(hasattr(config, k) for k in settings):
            continue
        if label == "tiled persistent" and batch > getattr(config, "PERSISTENT_MAX_BATCH", 16):
            continue
        variants.append((label, dict(settings)))
    return variants


def variant_precisions(label):
    """The precisions timed for a variant: both for the default, the resident and the cuBLAS step loops, exact for
    the tiled ones."""
    return PRECISIONS if label in ("default", "resident", "gemm-steps") else PRECISIONS[:1]


def default_settings(config):
    """The switches of ``config`` that the variants set, as they are now."""
    keys = ("PERSISTENT", "RESIDENT", "RESIDENT_MAX_BATCH", "STEP_GEMM", "BLAS")
    return {k: getattr(config, k) for k in keys if hasattr(config, k)}


def loops_of(fn):
    """``(result of fn(), {loop kind: count})`` of the time loops ``fn`` ran (``nblstm.cuda.launch.LOOPS``)."""
    try:
        from nblstm.cuda import launch

        before = dict(getattr(launch, "LOOPS", {}))
    except ImportError:
        return fn(), None
    value = fn()
    after = dict(getattr(launch, "LOOPS", {}))
    return value, {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


@contextlib.contextmanager
def config_set(config, settings):
    """Set attributes of ``config`` for the block; restore them after."""
    saved = {k: getattr(config, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(config, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def precision_kwargs(precision):
    """``precision="exact"`` is the default and is not passed (the call works without the keyword)."""
    return {} if precision == "exact" else {"precision": precision}


def to_host(a):
    """A GPU (or host) array as a NumPy array."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        return a.detach().cpu().numpy()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def max_abs(a, b):
    """Largest ``|a - b|`` (float64); ``inf`` when shapes differ or ``a`` is not finite."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def max_rel(a, b):
    """:func:`max_abs` over the largest ``|b|``."""
    err = max_abs(a, b)
    scale = float(np.max(np.abs(np.asarray(b, np.float64)))) if np.size(b) else 0.0
    return err / scale if scale else err


def torch_state_dict_like(rng, inputs, units):
    """A ``torch.nn.LSTM`` state dict as NumPy arrays, drawn as PyTorch draws (uniform in ``+-1/sqrt(H)``)."""
    k = 1.0 / math.sqrt(units)
    shapes = {"weight_ih_l0": (4 * units, inputs), "weight_hh_l0": (4 * units, units), "bias_ih_l0": (4 * units,),
              "bias_hh_l0": (4 * units,)}
    return {name: rng.uniform(-k, k, shape).astype(np.float32) for name, shape in shapes.items()}


def host_inputs(shape, seed=0):
    """``x [T, B, I]``, ``h0, c0 [B, H]`` float32, from one seed."""
    steps, batch, inputs, units = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, batch, inputs)).astype(np.float32)
    h0 = (rng.standard_normal((batch, units)) * 0.5).astype(np.float32)
    c0 = (rng.standard_normal((batch, units)) * 0.5).astype(np.float32)
    return x, h0, c0


# -- the run: results, budgets, sections ----------------------------------------------------------------------------

class Run:
    """The results of one run, its output folder and its clock.

    ``data`` is what goes to ``results.json``; ``markdown`` the sections'
    Markdown, in order; ``deadline`` the end of the current section's budget.
    """

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.total_end = self.start + args.budget
        self.deadline = self.total_end
        self.markdown = {}
        self.data = {
            "script": "scripts/gpu_bench.py",
            "argv": sys.argv[1:] if args.argv is None else list(args.argv),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "quick": args.quick, "sim_smoke": args.sim_smoke, "budget_s": args.budget,
            "sections": {},
        }

    def left(self):
        """Seconds left of the current section's budget."""
        return self.deadline - time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.start

    def log(self, text):
        print(text, flush=True)

    def save(self):
        path = self.out / "results.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_json_default, allow_nan=True) + "\n")
        tmp.replace(path)
        head = self._header()
        body = "\n\n".join(self.markdown[name] for name in SECTIONS if name in self.markdown)
        (self.out / "report.md").write_text(head + "\n\n" + body + "\n")

    def _header(self):
        env = self.data["sections"].get("env", {}).get("data", {})
        gpu = env.get("gpu", {}).get("name", "GPU not read")
        versions = env.get("versions", {})
        ver = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k in
                        ("nblstm", "torch", "cudnn", "numba", "numba-cuda", "nvmath-python", "cupy"))
        return (f"# nblstm on the GPU against cuDNN\n\nGenerated by `scripts/gpu_bench.py` on "
                f"{self.data['started']}: {gpu}. {ver}.")

    def section_markdown(self, name, text):
        self.markdown[name] = text
        (self.out / f"{name}.md").write_text(text + "\n")
        self.log(text)


def _json_default(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return repr(obj)


class SectionSkippedError(Exception):
    """A section that cannot run here (no PyTorch, no sanitizer...): recorded as skipped, with the reason."""


def run_sections(run, names, functions):
    """Run each section under its budget; record its data, time, notes and error; save after each."""
    for index, name in enumerate(names):
        later = sum(MIN_S[n] for n in names[index + 1:])
        now = time.monotonic()
        # --quick shortens every budget but the sanitizers' (their children compile every kernel).
        scale = 0.25 if run.args.quick and name != "sanitize" else 1.0
        budget = BUDGET_S[name] * scale
        run.deadline = min(now + budget, run.total_end - later)
        record = {"status": "running", "budget_s": round(run.deadline - now, 1), "notes": []}
        run.data["sections"][name] = record
        run.log(f"=== {name} (budget {record['budget_s']:.0f} s, {run.elapsed():.0f} s into the run)")
        if run.deadline - now < MIN_S[name] * scale:
            record["status"] = "skipped"
            record["notes"].append("no time left in the run's budget")
            run.section_markdown(name, f"## {name}\n\nSkipped: no time left in the run's budget.")
            run.save()
            continue
        try:
            record["data"] = functions[name](run, record)
            record["status"] = "ok"
        except SectionSkippedError as why:
            record["status"] = "skipped"
            record["notes"].append(str(why))
            run.section_markdown(name, f"## {name}\n\nSkipped: {why}")
        except Exception as exc:  # noqa: BLE001 - one failing section must not stop the others
            record["status"] = "error"
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()
            run.log(record["traceback"])
            previous = run.markdown.get(name, f"## {name}")
            run.section_markdown(name, f"{previous}\n\n**Section failed**: `{record['error'][:500]}`")
        record["seconds"] = round(time.monotonic() - now, 2)
        run.log(f"=== {name}: {record['status']} in {record['seconds']:.1f} s")
        run.save()


# -- CUDA helpers (imported when called) ----------------------------------------------------------------------------

def _numba_cuda():
    from numba import cuda

    return cuda


def _simulator():
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _torch_or_none():
    """PyTorch with a usable CUDA device, or ``None``."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no PyTorch here
        return None


class Timer:
    """Times calls of a function: CUDA events of PyTorch (``"torch"``), of Numba (``"numba"``) or wall time
    (``"wall"``, synchronising Numba's device; ``"host"``, nothing to synchronise).

    Each repetition is bracketed by two events on the current stream; the
    events are read after one synchronisation at the end, so the GPU is not
    left idle between repetitions. ``before()`` runs outside the brackets.
    """

    def __init__(self, kind):
        self.kind = kind
        if kind == "torch":
            import torch

            self.torch = torch
        elif kind in ("numba", "wall"):
            self.cuda = _numba_cuda()
        elif kind != "host":
            raise ValueError(f"unknown timer {kind!r}")

    def sync(self):
        if self.kind == "host":
            return
        if self.kind == "torch":
            self.torch.cuda.synchronize()
        else:
            self.cuda.synchronize()

    def times(self, fn, reps, before=None):
        """Milliseconds of ``reps`` calls of ``fn``."""
        if self.kind in ("wall", "host"):
            out = []
            for _ in range(reps):
                if before:
                    before()
                self.sync()
                t0 = time.perf_counter()
                fn()
                self.sync()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        if self.kind == "torch":
            pairs = [(self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))
                     for _ in range(reps)]
        else:
            pairs = [(self.cuda.event(timing=True), self.cuda.event(timing=True)) for _ in range(reps)]
        self.sync()
        for start, end in pairs:
            if before:
                before()
            start.record()
            fn()
            end.record()
        self.sync()
        if self.kind == "torch":
            return [s.elapsed_time(e) for s, e in pairs]
        return [self.cuda.event_elapsed_time(s, e) for s, e in pairs]


def measure(run, timer, fn, before=None, warmups=None):
    """Warm up, size the repetitions from one timed call, time them: :func:`median_stats`."""
    args = run.args
    for _ in range(args.warmups if warmups is None else warmups):
        if before:
            before()
        fn()
    timer.sync()
    reps = args.min_reps
    if args.max_reps > args.min_reps:
        probe = timer.times(fn, 1, before)[0]
        reps = reps_for(probe, args.target_s, args.min_reps, args.max_reps, run.left())
    return median_stats(timer.times(fn, reps, before))


def host_counts(fn):
    """``(kernel launches, device allocations)`` of one call of ``fn`` through Numba, or ``None`` (simulator)."""
    if _simulator():
        return None
    try:
        from nblstm._tools.gpu_check import _host_counts
    except (ImportError, AttributeError):
        return None
    return _host_counts(fn)


# -- TF32 switches of PyTorch ---------------------------------------------------------------------------------------

def tf32_state(torch):
    """PyTorch's TF32 switches as they are (legacy ``allow_tf32`` and, where present, ``fp32_precision``)."""
    state = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, get in (
            ("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
            ("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
            ("torch.backends.cuda.matmul.fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
            ("torch.backends.cudnn.rnn.fp32_precision", lambda: torch.backends.cudnn.rnn.fp32_precision),
            ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision),
        ):
            try:
                state[label] = get()
            except Exception as exc:  # noqa: BLE001 - absent in this PyTorch, or refused
                state[label] = f"n/a: {type(exc).__name__}"
    return state


def _set_tf32(torch, on):
    """Set cuDNN's and cuBLAS's TF32 switches (legacy API; the ``fp32_precision`` one where that is refused)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cudnn.allow_tf32 = on
            torch.backends.cuda.matmul.allow_tf32 = on
            return "allow_tf32"
        except Exception:  # noqa: BLE001 - a PyTorch that only takes the new API
            mode = "tf32" if on else "ieee"
            torch.backends.cuda.matmul.fp32_precision = mode
            torch.backends.cudnn.rnn.fp32_precision = mode
            return "fp32_precision"


def _get_tf32(torch):
    """The switches :func:`_set_tf32` sets, to restore them: ``(api, values)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "allow_tf32", (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        except Exception:  # noqa: BLE001 - a PyTorch that only has the new API
            return "fp32_precision", (torch.backends.cudnn.rnn.fp32_precision,
                                      torch.backends.cuda.matmul.fp32_precision)


def _restore_tf32(torch, saved):
    api, (cudnn, matmul) = saved
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if api == "allow_tf32":
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul
        else:
            torch.backends.cudnn.rnn.fp32_precision, torch.backends.cuda.matmul.fp32_precision = cudnn, matmul


@contextlib.contextmanager
def torch_tf32(torch, on):
    """TF32 on or off in PyTorch (cuDNN and cuBLAS) for the block, then the previous values."""
    saved = _get_tf32(torch)
    _set_tf32(torch, on)
    try:
        yield
    finally:
        _restore_tf32(torch, saved)


# -- section env ----------------------------------------------------------------------------------------------------

_DISTRIBUTIONS = (("numpy", "numpy"), ("numba", "numba"), ("numba-cuda", "numba_cuda"), ("torch", "torch"),
                  ("cupy", "cupy"), ("nvmath-python", "nvmath"), ("cuda-bindings", "cuda.bindings"),
                  ("cuda-python", None), ("scipy", "scipy"))


def _version(dist, module):
    for name in ([dist] if dist else []) + ([f"{dist}-cuda12x", f"{dist}-cuda13x", f"{dist}-cuda12", f"{dist}-cu12"]
                                            if dist in ("cupy", "nvmath-python") else []):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if module:
        try:
            return getattr(importlib.import_module(module), "__version__", "installed")
        except Exception:  # noqa: BLE001 - not importable here
            return None
    return None


def _git_commit():
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return out.stdout.strip() + (" (with local changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    fields = ("name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,"
              "power.limit,temperature.gpu,persistence_mode,compute_mode,mig.mode.current")
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv"], capture_output=True, text=True,
                             timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": repr(exc)}
    lines = [line for line in out.stdout.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return {"error": out.stderr.strip()[:300]}
    keys = [k.strip() for k in lines[0].split(",")]
    values = [v.strip() for v in lines[1].split(",")]
    return dict(zip(keys, values))


def section_env(run, record):
    import nblstm

    data = {"python": sys.version.split()[0], "platform": platform.platform(), "executable": sys.executable,
            "simulator": _simulator(), "git_commit": _git_commit()}
    versions = {"nblstm": getattr(nblstm, "__version__", None)}
    for dist, module in _DISTRIBUTIONS:
        versions[dist] = _version(dist, module)
    data["versions"] = versions
    gpu = {}
    cuda = _numba_cuda()
    gpu["numba cuda.is_available()"] = bool(cuda.is_available())
    if gpu["numba cuda.is_available()"]:
        dev = cuda.get_current_device()
        name = getattr(dev, "name", "CUDA simulator")
        gpu["name"] = name.decode() if isinstance(name, bytes) else str(name)
        gpu["compute_capability"] = getattr(dev, "compute_capability", None)
        for attr in ("MULTIPROCESSOR_COUNT", "L2_CACHE_SIZE", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
                     "GLOBAL_MEMORY_BUS_WIDTH", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_BLOCK",
                     "MAX_REGISTERS_PER_MULTIPROCESSOR", "COOPERATIVE_LAUNCH", "MAX_THREADS_PER_MULTIPROCESSOR"):
            try:
                gpu[attr] = getattr(dev, attr)
            except Exception as exc:  # noqa: BLE001 - attribute not readable (simulator, old driver)
                gpu[attr] = f"n/a: {type(exc).__name__}"
        if not _simulator():
            with contextlib.suppress(Exception):
                gpu["driver (numba)"] = cuda.cudadrv.driver.driver.get_version()
            with contextlib.suppress(Exception):
                gpu["runtime (numba)"] = cuda.runtime.get_version()
    smi = _nvidia_smi()
    if smi:
        gpu["nvidia-smi"] = smi
    torch = _torch_or_none()
    if torch is not None:
        props = torch.cuda.get_device_properties(0)
        gpu.setdefault("name", props.name)
        gpu["torch"] = {"name": props.name, "sm_count": props.multi_processor_count,
                        "total_memory_GiB": round(props.total_memory / 2**30, 1),
                        "L2_cache_size": getattr(props, "L2_cache_size", None),
                        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
        versions["cudnn"] = torch.backends.cudnn.version()
        data["tf32_defaults"] = tf32_state(torch)
    else:
        data["tf32_defaults"] = "PyTorch with CUDA is not importable"
    data["gpu"] = gpu
    nb = {}
    try:
        from nblstm.cuda import config

        nb["config"] = {k: getattr(config, k) for k in ("PERSISTENT", "PERSISTENT_MAX_BATCH", "RESIDENT", "BLAS",
                                                        "SIMULATOR") if hasattr(config, k)}
        nb["has RESIDENT"] = hasattr(config, "RESIDENT")
    except Exception as exc:  # noqa: BLE001
        nb["config"] = f"n/a: {exc!r}"
    try:
        blas = importlib.import_module("nblstm.cuda.blas")
        backend_name = getattr(blas, "backend_name", None)
        nb["blas backend_name()"] = backend_name() if backend_name else "n/a: no backend_name()"
    except Exception as exc:  # noqa: BLE001 - the module may be absent in this version
        nb["blas backend_name()"] = f"n/a: {type(exc).__name__}: {exc}"
    for fn in ("block_lstm", "block_lstm_grad"):
        nb[f"{fn} has precision="] = "precision" in inspect.signature(getattr(nblstm, fn)).parameters
    data["nblstm"] = nb

    lines = ["## Environment", ""]
    lines += [f"- **{k}**: {v}" for k, v in versions.items() if v is not None]
    lines += [f"- **python**: {data['python']} ({data['platform']})", f"- **git**: {data['git_commit']}"]
    for k, v in gpu.items():
        if isinstance(v, dict):
            lines.append(f"- **{k}**: " + ", ".join(f"{a}={b}" for a, b in v.items()))
        else:
            lines.append(f"- **{k}**: {v}")
    if isinstance(data["tf32_defaults"], dict):
        lines.append("- **PyTorch TF32 defaults**: " + ", ".join(f"`{k}` = {v}"
                                                                   for k, v in data["tf32_defaults"].items()))
    for k, v in nb.items():
        lines.append(f"- **nblstm {k}**: {v}")
    run.section_markdown("env", "\n".join(lines))
    return data


# -- section ceilings -----------------------------------------------------------------------------------------------

def section_ceilings(run, record):
    torch = _torch_or_none()
    smoke = run.args.sim_smoke
    data = {}
    rows = []
    copy_bytes = 2**14 * 4 if smoke else 2**30  # per buffer; moved: read + write
    if torch is not None and not smoke:
        timer = Timer("torch")
        src = torch.empty(copy_bytes // 4, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        stats = measure(run, timer, lambda: dst.copy_(src), warmups=2)
        del src, dst
    else:
        cuda = _numba_cuda()
        timer = Timer("wall" if _simulator() else "numba")
        src = cuda.to_device(np.ones(copy_bytes // 4, np.float32))
        dst = cuda.device_array_like(src)
        stats = measure(run, timer, lambda: dst.copy_to_device(src), warmups=2)
        del src, dst
    gbs = 2 * copy_bytes / (stats["median_ms"] * 1e-3) / 1e9
    data["d2d_copy"] = {"bytes_per_buffer": copy_bytes, "GB_per_s": gbs, **stats}
    rows.append(("device-to-device copy", f"{copy_bytes / 2**20:.3g} MiB", fmt_ms(stats["median_ms"]),
                 f"{gbs:.0f} GB/s (read + write)"))
    if torch is None or smoke:
        record["notes"].append("matmul: needs PyTorch with CUDA")
        rows.append(("8192^3 matmul", "float32", "-", "n/a: needs PyTorch with CUDA"))
    else:
        n = 8192
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        for on in (False, True):
            if run.left() < 3:
                record["notes"].append(f"matmul TF32 {'on' if on else 'off'}: skipped (time budget)")
                continue
            with torch_tf32(torch, on):
                stats = measure(run, Timer("torch"), lambda: torch.matmul(a, b), warmups=2)
            tflops = 2 * n**3 / (stats["median_ms"] * 1e-3) / 1e12
            key = f"matmul_8192_tf32_{'on' if on else 'off'}"
            data[key] = {"TFLOP_per_s": tflops, **stats}
            rows.append((f"8192^3 matmul, TF32 {'on' if on else 'off'}", "float32", fmt_ms(stats["median_ms"]),
                         f"{tflops:.1f} TFLOP/s"))
        del a, b
        torch.cuda.empty_cache()
    text = "## Ceilings\n\nCUDA-event medians.\n\n" + markdown_table(("what", "size", "ms", "rate"), rows)
    run.section_markdown("ceilings", text)
    return data


# -- section compare ------------------------------------------------------------------------------------------------

class Case:
    """One shape's arrays, on PyTorch tensors (with a cuDNN ``nn.LSTM``) or Numba device arrays.

    The same weights feed both: cuDNN's state dict converted with
    :func:`nblstm.convert.torch_to_block_lstm_v2` (gate layout ``ifco``).
    """

    def __init__(self, shape, backend, seed=0, device="cuda"):
        from nblstm.convert import torch_to_block_lstm_v2

        self.shape = shape
        self.backend = backend
        steps, batch, inputs, units = shape
        x, h0, c0 = host_inputs(shape, seed)
        self.host = {"x": x, "h0": h0, "c0": c0}
        if backend == "torch":
            import torch

            self.torch = torch
            torch.manual_seed(seed)
            self.lstm = torch.nn.LSTM(inputs, units).to(device)
            w, b, _ = torch_to_block_lstm_v2(self.lstm.state_dict())
            dev = torch.device(device)

            def put(a):
                return torch.as_tensor(np.ascontiguousarray(a), device=dev)
        else:
            cuda = _numba_cuda()
            self.lstm = None
            w, b, _ = torch_to_block_lstm_v2(torch_state_dict_like(np.random.default_rng(seed + 1), inputs, units))

            def put(a):
                return cuda.to_device(np.ascontiguousarray(a))
        self.host.update(w=w.astype(np.float32), b=b.astype(np.float32))
        self.x, self.h0, self.c0 = put(x), put(h0), put(c0)
        self.w, self.b = put(self.host["w"]), put(self.host["b"])
        self.h_grad = put(np.ones((steps, batch, units), np.float32))
        if device != "cuda":
            self.timer = Timer("host")  # PyTorch on the CPU: a check of this code without a GPU
        else:
            self.timer = Timer("torch" if backend == "torch" else ("wall" if _simulator() else "numba"))

    # nblstm
    def nblstm_fns(self, precision):
        import nblstm

        kw = precision_kwargs(precision)
        core = (self.x, self.c0, self.h0, self.w)

        def fwd():
            return nblstm.block_lstm(*core, self.b, layout="ifco", **kw)

        def bwd(outs):
            return nblstm.block_lstm_grad(*core, outs, h_grad=self.h_grad, layout="ifco", **kw)

        def fwd_bwd():
            return bwd(fwd())

        return fwd, bwd, fwd_bwd

    # cuDNN
    def cudnn_fns(self):
        torch = self.torch
        x = self.x.detach().clone().requires_grad_(True)
        h0 = self.h0[None].detach().clone().requires_grad_(True)
        c0 = self.c0[None].detach().clone().requires_grad_(True)
        self._cudnn_leaves = (x, h0, c0)

        def before():
            self.lstm.zero_grad(set_to_none=True)
            x.grad = h0.grad = c0.grad = None

        def fwd():
            return self.lstm(x, (h0, c0))

        def fwd_bwd():
            y, _ = self.lstm(x, (h0, c0))
            y.backward(self.h_grad)

        return before, fwd, fwd_bwd, torch

    def cudnn_reference(self):
        """cuDNN's outputs and gradients of one forward + backward (host arrays, nblstm's names and layout)."""
        before, _, _, _ = self.cudnn_fns()
        x, h0, c0 = self._cudnn_leaves
        before()
        y, (hn, cn) = self.lstm(x, (h0, c0))
        y.backward(self.h_grad)
        p = dict(self.lstm.named_parameters())
        w_grad = np.concatenate([to_host(p["weight_ih_l0"].grad).T, to_host(p["weight_hh_l0"].grad).T], axis=0)
        return {"h": to_host(y), "c_T": to_host(cn[0]), "x_grad": to_host(x.grad), "w_grad": w_grad,
                "b_grad": to_host(p["bias_ih_l0"].grad), "h_prev_grad": to_host(h0.grad[0]),
                "cs_prev_grad": to_host(c0.grad[0])}

    def cpu_reference(self):
        """nblstm's CPU target on the same arrays (the reference without PyTorch)."""
        import nblstm

        hst = self.host
        core = (hst["x"], hst["c0"], hst["h0"], hst["w"])
        outs = nblstm.block_lstm(*core, hst["b"], layout="ifco")
        grads = nblstm.block_lstm_grad(*core, outs, h_grad=np.ones_like(outs.h), layout="ifco")
        return {"h": outs.h, "c_T": outs.cs[-1], "x_grad": grads.x_grad, "w_grad": grads.w_grad,
                "b_grad": grads.b_grad, "h_prev_grad": grads.h_prev_grad, "cs_prev_grad": grads.cs_prev_grad}


def errors_against(ref, outs, grads):
    """Largest errors of nblstm's outputs and gradients against a reference (see :meth:`Case.cudnn_reference`)."""
    err = {"h_abs": max_abs(to_host(outs.h), ref["h"]), "c_T_abs": max_abs(to_host(outs.cs)[-1], ref["c_T"])}
    if grads is not None:
        for name in ("x_grad", "w_grad", "b_grad", "h_prev_grad", "cs_prev_grad"):
            err[f"{name}_rel"] = max_rel(to_host(getattr(grads, name)), ref[name])
    return err


def _reference_errors(ref, other):
    """Errors of one reference-shaped dict against another (cuDNN TF32 on against off)."""
    err = {"h_abs": max_abs(other["h"], ref["h"]), "c_T_abs": max_abs(other["c_T"], ref["c_T"])}
    for name in ("x_grad", "w_grad", "b_grad", "h_prev_grad", "cs_prev_grad"):
        err[f"{name}_rel"] = max_rel(other[name], ref[name])
    return err


def _nblstm_run(run, case, ref, precision, settings, record):
    """Time one nblstm variant and precision on a case: ``{fwd, fwd_bwd, errors, launches, first_call_s}``."""
    from nblstm.cuda import config

    out = {"precision": precision, "settings": settings}
    fwd, bwd, fwd_bwd = case.nblstm_fns(precision)
    with config_set(config, settings):
        t0 = time.perf_counter()
        try:
            (outs, grads), out["loops"] = loops_of(lambda: (lambda o: (o, bwd(o)))(fwd()))
            case.timer.sync()
        except (TypeError, ValueError) as exc:
            out["na"] = f"n/a: {type(exc).__name__}: {exc}"
            return out
        out["first_call_s"] = round(time.perf_counter() - t0, 3)
        out["errors"] = errors_against(ref, outs, grads) if ref is not None else None
        del outs, grads
        fwd_counts = host_counts(fwd)
        bwd_counts = None
        if fwd_counts is not None:
            outs = fwd()
            bwd_counts = host_counts(lambda: bwd(outs))
            del outs
        out["launches"] = {"fwd": fwd_counts and fwd_counts[0], "bwd": bwd_counts and bwd_counts[0],
                           "allocations_fwd": fwd_counts and fwd_counts[1],
                           "allocations_bwd": bwd_counts and bwd_counts[1]}
        for kind, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
            if run.left() < 2:
                record["notes"].append(f"{shape_label(case.shape)} {settings} {precision} {kind}: skipped (budget)")
                continue
            out[kind] = measure(run, case.timer, fn)
    return out


def _which_default(variants):
    """The time loops the default run took (``"resident"``, ``"gemm-steps"``, ...), from its first call."""
    default = next((v for v in variants if v["label"] == "default" and v.get("loops")), None)
    return sorted(default["loops"]) if default else None


def compare_case(run, shape, backend, record):
    """Everything the compare section measures on one shape."""
    from nblstm.cuda import config

    case = Case(shape, backend)
    result = {"shape": list(shape), "backend": backend, "cudnn": {}, "nblstm": []}
    if backend == "torch":
        torch = case.torch
        with torch_tf32(torch, False):
            ref = case.cudnn_reference()
        result["reference"] = "cuDNN, TF32 off"
        for on in (False, True):
            label = "on" if on else "off"
            with torch_tf32(torch, on):
                entry = {"tf32_state": tf32_state(torch)}
                if on:
                    entry["errors"] = _reference_errors(ref, case.cudnn_reference())
                before, fwd, fwd_bwd, _ = case.cudnn_fns()
                for kind, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                    entry[kind] = measure(run, case.timer, fn, before=before)
                with torch.no_grad():
                    entry["fwd_no_grad"] = measure(run, case.timer, fwd)
            result["cudnn"][label] = entry
        _set_tf32(torch, False)
    else:
        steps, batch, inputs, units = shape
        big = 2.0 * steps * batch * (inputs + units) * 4 * units > 5e10
        ref = None if big else case.cpu_reference()
        result["reference"] = "nblstm CPU target" if ref is not None else "none (too large for the CPU here)"
        record["notes"].append(f"{shape_label(shape)}: no PyTorch with CUDA: no cuDNN times; errors against "
                               f"{result['reference']}")
    result["default_settings"] = default_settings(config)
    for label, settings in loop_variants(config, shape[1]):
        for precision in variant_precisions(label):
            if run.left() < 3:
                record["notes"].append(f"{shape_label(shape)} {label} {precision}: skipped (time budget)")
                continue
            entry = _nblstm_run(run, case, ref, precision, settings, record)
            entry["label"] = label
            result["nblstm"].append(entry)
            run.log(f"  {shape_label(shape)} {label:28} {precision:5} "
                    + (entry.get("na") or f"fwd {fmt_ms(entry.get('fwd', {}).get('median_ms'))} ms, f+b "
                       f"{fmt_ms(entry.get('fwd_bwd', {}).get('median_ms'))} ms"))
    result["default_is"] = _which_default(result["nblstm"])
    del case
    with contextlib.suppress(Exception):
        from nblstm.cuda import launch

        launch.release_workspaces()
    if backend == "torch":
        sys.modules["torch"].cuda.empty_cache()
    return result


def _ms(entry, kind):
    return (entry.get(kind) or {}).get("median_ms") if entry else None


def _short(text, length=48):
    """A table cell's cut of a long message (``results.json`` keeps it whole)."""
    return text if len(text) <= length else text[:length - 1] + "…"


def compare_rows(results):
    """Rows of the main comparison table from the compare section's results (pure)."""
    rows = []
    for res in results:
        off, on = res["cudnn"].get("off"), res["cudnn"].get("on")
        for e in res["nblstm"]:
            label = e["label"]
            if label == "default" and res.get("default_is"):
                label = f"default (= {' / '.join(res['default_is'])})"
            if "na" in e:
                rows.append((shape_label(res["shape"]), label, e["precision"], _short(e["na"]), *["-"] * 13))
                continue
            f, fb = _ms(e, "fwd"), _ms(e, "fwd_bwd")
            err = e.get("errors") or {}
            launches = e.get("launches") or {}
            rows.append((
                shape_label(res["shape"]), label, e["precision"],
                fmt_ms(f), fmt_ms(_ms(off, "fwd")), fmt_ratio(ratio(f, _ms(off, "fwd"))),
                fmt_ms(_ms(on, "fwd")), fmt_ratio(ratio(f, _ms(on, "fwd"))),
                fmt_ms(fb), fmt_ms(_ms(off, "fwd_bwd")), fmt_ratio(ratio(fb, _ms(off, "fwd_bwd"))),
                fmt_ms(_ms(on, "fwd_bwd")), fmt_ratio(ratio(fb, _ms(on, "fwd_bwd"))),
                fmt_err(err.get("h_abs")), fmt_err(err.get("c_T_abs")), fmt_err(err.get("w_grad_rel")),
                f"{launches.get('fwd', '-')}/{launches.get('bwd', '-')}",
            ))
    return rows


COMPARE_HEADERS = ("T,B,I,H", "variant", "precision", "nblstm fwd ms", "cuDNN fwd ms (TF32 off)", "ratio",
                   "cuDNN fwd ms (TF32 on)", "ratio vs TF32 on", "nblstm fwd+bwd ms", "cuDNN fwd+bwd ms (TF32 off)",
                   "ratio", "cuDNN fwd+bwd ms (TF32 on)", "ratio vs TF32 on", "max abs h err", "max abs c_T err",
                   "max rel dW err", "launches fwd/bwd")
TARGET_HEADERS = ("T,B,I,H", "nblstm (default variant)", "against", "target", "fwd ratio", "fwd", "fwd+bwd ratio",
                  "fwd+bwd", "best variant, fwd+bwd ratio")


def target_rows(results):
    """Rows of the targets table: the default variant's ratios against :data:`TARGETS` (pure)."""
    rows = []
    for res in results:
        shape = tuple(res["shape"])
        for precision in PRECISIONS:
            which = TARGET_REFERENCE[precision]
            ref = res["cudnn"].get(which)
            target = TARGETS.get(shape, {}).get(precision)
            default = next((e for e in res["nblstm"] if e["label"] == "default" and e["precision"] == precision),
                           None)
            if default is None or "na" in default:
                why = _short(default["na"]) if default else "not run"
                rows.append((shape_label(shape), precision, f"cuDNN TF32 {which}", fmt_ratio(target), "-", why,
                             "-", why, "-"))
                continue
            rf = ratio(_ms(default, "fwd"), _ms(ref, "fwd"))
            rfb = ratio(_ms(default, "fwd_bwd"), _ms(ref, "fwd_bwd"))
            best = None
            for e in res["nblstm"]:
                if e["precision"] == precision and "na" not in e:
                    r = ratio(_ms(e, "fwd_bwd"), _ms(ref, "fwd_bwd"))
                    if r is not None and (best is None or r < best[0]):
                        best = (r, e["label"])
            rows.append((shape_label(shape), precision, f"cuDNN TF32 {which}", fmt_ratio(target), fmt_ratio(rf),
                         verdict(rf, target), fmt_ratio(rfb), verdict(rfb, target),
                         f"{fmt_ratio(best[0])} ({best[1]})" if best else "-"))
    return rows


def cudnn_tf32_rows(results):
    rows = []
    for res in results:
        err = (res["cudnn"].get("on") or {}).get("errors")
        if err:
            same = err["h_abs"] == 0 and err["w_grad_rel"] == 0
            rows.append((shape_label(res["shape"]), fmt_err(err["h_abs"]), fmt_err(err["c_T_abs"]),
                         fmt_err(err["x_grad_rel"]), fmt_err(err["w_grad_rel"]),
                         "identical: TF32 did not take effect" if same else ""))
    return rows


def compare_markdown(results, notes=()):
    parts = ["## nblstm against cuDNN", "",
             "float32, `torch.nn.LSTM` weights converted with `nblstm.convert.torch_to_block_lstm_v2`; CUDA-event "
             "medians after warm-up; ratio = nblstm / cuDNN (below 1: nblstm is faster). Forward + backward: "
             "`block_lstm` then `block_lstm_grad(h_grad=ones)` against `y.backward(ones)` (gradients of x, h0, "
             "c0 and every weight). cuDNN's forward is timed with autograd on (it keeps what its backward needs, "
             "as nblstm's forward does). Errors against cuDNN with TF32 off (against nblstm's CPU target where "
             "PyTorch is absent); dW relative to its largest element.", "",
             markdown_table(COMPARE_HEADERS, compare_rows(results)), "",
             "### Targets", "",
             "Ratios of the default variant; met: ratio at or below the target.", "",
             markdown_table(TARGET_HEADERS, target_rows(results))]
    rows = cudnn_tf32_rows(results)
    if rows:
        parts += ["", "### cuDNN with TF32 on against cuDNN with TF32 off", "",
                  markdown_table(("T,B,I,H", "max abs h err", "max abs c_T err", "max rel dx err", "max rel dW err",
                                  "note"), rows)]
    if notes:
        parts += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(parts)


def section_compare(run, record):
    backend = "torch" if _torch_or_none() is not None and not run.args.sim_smoke else "numba"
    if backend == "numba":
        cuda = _numba_cuda()
        if not cuda.is_available():
            raise SectionSkippedError("no CUDA GPU and no simulator")
        record["notes"].append("PyTorch with CUDA is not importable (or --sim-smoke): Numba device arrays, "
                               "no cuDNN")
    results = []
    section_deadline = run.deadline
    shapes = run.args.shapes
    for index, shape in enumerate(shapes):
        # Each shape gets an equal share of the time left, so that the last shapes are measured too.
        now = time.monotonic()
        run.deadline = now + (section_deadline - now) / (len(shapes) - index)
        if section_deadline - now < 5:
            record["notes"].append(f"{shape_label(shape)}: skipped (time budget)")
            continue
        try:
            results.append(compare_case(run, shape, backend, record))
        except Exception as exc:  # noqa: BLE001 - the next shape still runs
            record["notes"].append(f"{shape_label(shape)}: {type(exc).__name__}: {exc}")
            run.log(traceback.format_exc())
        finally:
            run.deadline = section_deadline
        record["data"] = {"results": results}
        run.save()
    text = compare_markdown(results, record["notes"])
    run.section_markdown("compare", text)
    (run.out / "compare.txt").write_text(text_table(COMPARE_HEADERS, compare_rows(results)) + "\n\n"
                                         + text_table(TARGET_HEADERS, target_rows(results)) + "\n")
    return {"results": results}


# -- section profile ------------------------------------------------------------------------------------------------

def _kernel_rows(prof, top=12):
    """``[(name, calls, total_us)]`` of the GPU kernels (and copies) of a profile, most time first."""
    totals = {}
    for evt in prof.events():
        if "CUDA" not in str(getattr(evt, "device_type", "")):
            continue
        try:
            dur = evt.time_range.elapsed_us()
        except Exception:  # noqa: BLE001 - an older FunctionEvent
            dur = getattr(evt, "device_time", None) or getattr(evt, "cuda_time", 0)
        calls, total = totals.get(evt.name, (0, 0.0))
        totals[evt.name] = (calls + 1, total + float(dur))
    rows = sorted(((n, c, t) for n, (c, t) in totals.items()), key=lambda r: -r[2])
    return rows[:top], sum(t for _, _, t in rows), sum(c for _, c, _ in rows)


def section_profile(run, record):
    torch = _torch_or_none()
    if torch is None or run.args.sim_smoke:
        raise SectionSkippedError("needs PyTorch with CUDA (torch.profiler)")
    from torch.profiler import ProfilerActivity, profile

    data = {}
    texts = []
    md = ["## Kernel profile", "",
          "One forward + backward under `torch.profiler` (CUDA activity), after warm-up; the 12 kernels that "
          "took the most GPU time. Full tables: `profile.txt`."]
    for shape in run.args.shapes:
        if run.left() < 4:
            record["notes"].append(f"{shape_label(shape)}: skipped (time budget)")
            continue
        case = Case(shape, "torch")
        runs = []
        for precision in PRECISIONS:
            _, _, fwd_bwd = case.nblstm_fns(precision)
            runs.append((f"nblstm precision={precision}", fwd_bwd, None))
        before, _, cudnn_fb, _ = case.cudnn_fns()
        runs.append(("cuDNN TF32 off", cudnn_fb, before))
        for label, fn, pre in runs:
            try:
                with torch_tf32(torch, False):
                    for _ in range(2):
                        if pre:
                            pre()
                        fn()
                    torch.cuda.synchronize()
                    if pre:
                        pre()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        fn()
                        torch.cuda.synchronize()
            except (TypeError, ValueError) as exc:
                data[f"{shape_label(shape)} {label}"] = {"na": f"n/a: {exc}"}
                continue
            except Exception as exc:  # noqa: BLE001 - the next run still goes
                data[f"{shape_label(shape)} {label}"] = {"error": f"{type(exc).__name__}: {exc}"}
                record["notes"].append(f"{shape_label(shape)} {label}: {type(exc).__name__}: {exc}")
                continue
            top, total_us, launches = _kernel_rows(prof)
            key = f"{shape_label(shape)} {label}"
            data[key] = {"kernels": [{"name": n, "calls": c, "total_us": t} for n, c, t in top],
                         "gpu_total_us": total_us, "gpu_events": launches}
            md += ["", f"### {shape_label(shape)}: {label}", "",
                   f"GPU time of all kernels and copies: {total_us / 1e3:.3f} ms in {launches} events.", "",
                   markdown_table(("kernel", "calls", "GPU ms", "share"),
                                  [(n[:90], c, f"{t / 1e3:.3f}", f"{100 * t / total_us:.0f} %" if total_us else "-")
                                   for n, c, t in top])]
            try:
                table = prof.key_averages().table(sort_by="device_time_total", row_limit=12, max_name_column_width=90)
            except Exception:  # noqa: BLE001 - an older PyTorch's sort key
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
            texts.append(f"=== {key}\n{table}")
        del case
        torch.cuda.empty_cache()
    (run.out / "profile.txt").write_text("\n\n".join(texts) + "\n")
    run.section_markdown("profile", "\n".join(md))
    return data


# -- section sanitize -----------------------------------------------------------------------------------------------

def _sanitize_fused(a, d, opts, seq_len_max, precision, settings):
    """block_lstm + block_lstm_grad on the device arrays ``d`` against the CPU on ``a``: the largest relative error."""
    import nblstm
    from nblstm.cuda import config

    peep = ("wci", "wcf", "wco") if opts.get("use_peephole") else ()
    core = ("x", "cs_prev", "h_prev", "w")
    fkw = dict(opts, seq_len_max=seq_len_max)
    bkw = {k: v for k, v in fkw.items() if k in ("layout", "use_peephole", "seq_len_max")}
    kw = precision_kwargs(precision)
    cpu = nblstm.block_lstm(*(a[k] for k in core), a["b"], *(a[k] for k in peep), **fkw)
    cpu_g = nblstm.block_lstm_grad(*(a[k] for k in core), cpu, a["cs_grad"], a["h_grad"], *(a[k] for k in peep),
                                   **bkw)
    with config_set(config, settings):
        gpu = nblstm.block_lstm(*(d[k] for k in core), d["b"], *(d[k] for k in peep), **fkw, **kw)
        gpu_g = nblstm.block_lstm_grad(*(d[k] for k in core), gpu, d["cs_grad"], d["h_grad"], *(d[k] for k in peep),
                                       **bkw, **kw)
    errs = [max_rel(to_host(g), c) for g, c in zip(gpu, cpu)]
    errs += [max_rel(to_host(g), c) for g, c in zip(gpu_g, cpu_g)]
    return max(errs)


def _sanitize_cell(a, d, shape, precision, settings):
    """``LSTMCell.run`` and ``vjp`` (peepholes, clipping, a projection, lengths) on the GPU against the CPU."""
    import nblstm
    from nblstm.cuda import config

    cuda = _numba_cuda()
    steps, batch, inputs, units = shape
    cell_kw = dict(use_peepholes=True, cell_clip=1.5, num_proj=max(units // 2, 1), proj_clip=0.8, dtype=np.float32,
                   seed=1)
    cell = nblstm.LSTMCell(units, **cell_kw)
    lengths = np.array([steps if i % 2 == 0 else i % (steps + 1) for i in range(batch)])
    (out, final), backward = cell.vjp(a["x"], None, lengths)
    d_out = np.ones_like(out)
    ref = [out, final.c, final.h, backward(d_out)[0]]
    gcell = nblstm.LSTMCell(units, **cell_kw, **precision_kwargs(precision))
    gcell.build(inputs)
    gcell.set_weights(cell.get_weights())
    with config_set(config, settings):
        g_out, g_final = gcell.run(d["x"], None, cuda.to_device(lengths))
        (g_out2, _), g_backward = gcell.vjp(d["x"], None, cuda.to_device(lengths))
        g_dx = g_backward(cuda.to_device(d_out))[0]
    errs = [max_rel(to_host(g), r) for g, r in zip((g_out, g_final.c, g_final.h, g_dx), ref)]
    errs.append(max_rel(to_host(g_out2), out))
    return max(errs)


def sanitize_case(shapes=SANITIZE_SHAPES, out=None, log=print, variant_limit=None):
    """The child's work: every op and ``LSTMCell`` on small shapes, each loop variant and precision.

    Numba device arrays only (no PyTorch). Each result is checked against
    the CPU target. Returns ``{"cases": [...], "failures": n}``; a case that
    raises a ``TypeError``/``ValueError`` for ``precision="tf32"`` is n/a.
    ``variant_limit`` keeps the first variants of :func:`loop_variants` only
    (the simulator's smoke run).
    """
    from nblstm.cuda import config

    cuda = _numba_cuda()
    cases = []
    tol = {"exact": 1e-4, "tf32": 3e-2}

    def record(name, precision, fn):
        entry = {"case": name, "precision": precision}
        t0 = time.perf_counter()
        try:
            entry["max_rel_err"] = fn()
            cuda.synchronize()
            entry["ok"] = entry["max_rel_err"] <= tol[precision]
        except (TypeError, ValueError) as exc:
            if precision == "exact":
                entry.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            else:
                entry.update(ok=True, na=f"n/a: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - recorded, the next case runs
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        cases.append(entry)
        log(f"  {name} {precision}: " + (entry.get("na") or entry.get("error")
                                          or f"max rel err {entry['max_rel_err']:.1e} "
                                          f"{'ok' if entry['ok'] else 'FAIL'}"))

    for shape in shapes:
        steps, batch, inputs, units = shape
        rng = np.random.default_rng(sum(shape))
        a = {
            "x": rng.standard_normal((steps, batch, inputs)), "cs_prev": rng.standard_normal((batch, units)),
            "h_prev": rng.standard_normal((batch, units)),
            "w": rng.standard_normal((inputs + units, 4 * units)) / np.sqrt(inputs + units),
            "b": rng.standard_normal(4 * units) * 0.2, "wci": rng.standard_normal(units) * 0.5,
            "wcf": rng.standard_normal(units) * 0.5, "wco": rng.standard_normal(units) * 0.5,
            "cs_grad": rng.standard_normal((steps, batch, units)), "h_grad": rng.standard_normal((steps, batch, units)),
        }
        a = {k: v.astype(np.float32) for k, v in a.items()}
        try:
            d = {k: cuda.to_device(v) for k, v in a.items()}
        except Exception as exc:  # noqa: BLE001 - no device: recorded as a failed case
            cases.append({"case": f"setup {shape_label(shape)}", "precision": "-", "ok": False,
                          "error": f"{type(exc).__name__}: {exc}"})
            log(f"  setup {shape_label(shape)}: {type(exc).__name__}: {exc}")
            continue
        options = [("plain", dict(layout="ifco"), None),
                   ("peephole+clip+S=T-1", dict(layout="icfo", use_peephole=True, cell_clip=0.9, forget_bias=1.0),
                    max(steps - 1, 0))]
        for label, settings in loop_variants(config, batch)[:variant_limit]:
            for precision in PRECISIONS:
                for opt_name, opts, seq_len_max in options:
                    if opt_name == "plain" or label == "default":
                        record(f"block_lstm+grad {shape_label(shape)} {label} {opt_name}", precision,
                               functools.partial(_sanitize_fused, a, d, opts, seq_len_max, precision, settings))
                record(f"LSTMCell run+vjp {shape_label(shape)} {label}", precision,
                       functools.partial(_sanitize_cell, a, d, shape, precision, settings))
    failures = sum(not c["ok"] for c in cases)
    result = {"cases": cases, "failures": failures}
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")
    log(f"sanitize cases: {len(cases)} run, {failures} failed")
    return result


def _find_sanitizer():
    exe = shutil.which("compute-sanitizer")
    if exe:
        return exe
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and Path(base, "bin", "compute-sanitizer").exists():
            return str(Path(base, "bin", "compute-sanitizer"))
    return None


def sanitizer_command(exe, tool, child_out, quick):
    """The compute-sanitizer command line running this script's ``--sanitize-case`` under ``tool``."""
    cmd = [exe, "--tool", tool, "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "30"]
    if tool == "memcheck":
        cmd += ["--leak-check", "no"]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--sanitize-case", "--sanitize-out", str(child_out)]
    if quick:
        cmd.append("--quick")
    return cmd


def section_sanitize(run, record):
    if run.args.sim_smoke or _simulator():
        record["notes"].append("simulator: the cases run in this process, without compute-sanitizer")
        shapes = SANITIZE_SMOKE_SHAPES
        result = sanitize_case(shapes, log=run.log, variant_limit=1)
        rows = [("in-process (simulator)", "-", "-", f"{len(result['cases'])} cases, {result['failures']} failed",
                 "-")]
        run.section_markdown("sanitize", "## compute-sanitizer\n\nSimulator: the sanitizer cases ran in this process "
                             "(no compute-sanitizer), the default loop variant.\n\n"
                             + markdown_table(("tool", "exit status", "summary", "cases", "seconds"), rows))
        return {"in_process": result}
    exe = _find_sanitizer()
    if exe is None:
        raise SectionSkippedError("compute-sanitizer is not on PATH (nor in $CUDA_HOME/bin or /usr/local/cuda/bin)")
    tools = run.args.sanitize_tools
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    timeout = max(10, min(run.args.sanitize_timeout, run.left() - 5))
    shapes = SANITIZE_QUICK_SHAPES if run.args.quick else SANITIZE_SHAPES
    procs = {}
    for tool in tools:
        log_path = run.out / f"sanitize_{tool}.log"
        child_out = run.out / f"sanitize_{tool}_cases.json"
        cmd = sanitizer_command(exe, tool, child_out, run.args.quick)
        handle = open(log_path, "w")  # noqa: SIM115 - closed below, after the process ends
        procs[tool] = (subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=root,
                                        start_new_session=True), handle, log_path, child_out, cmd, time.monotonic())
        if not run.args.sanitize_concurrent:
            _wait_tool(procs[tool], timeout)
    data = {"timeout_s": timeout, "concurrent": run.args.sanitize_concurrent, "tools": {}}
    rows = []
    for tool, entry in procs.items():
        rc, seconds = _wait_tool(entry, timeout)
        _, _, log_path, child_out, cmd, _ = entry
        text = log_path.read_text(errors="replace")
        cases = None
        if child_out.exists():
            with contextlib.suppress(ValueError):
                cases = json.loads(child_out.read_text())
        info = {"command": cmd, "exit_status": rc, "timed_out": rc == "timeout", "seconds": seconds,
                "summary": summary_lines(text), "errors": sanitizer_errors(text), "log": log_path.name,
                "log_tail": text[-3000:],
                "cases_run": None if cases is None else len(cases["cases"]),
                "case_failures": None if cases is None else cases["failures"]}
        data["tools"][tool] = info
        rows.append((tool, rc, "; ".join(info["summary"]) or "(no summary line)",
                     "-" if cases is None else f"{len(cases['cases'])} cases, {cases['failures']} failed",
                     f"{seconds:.0f}"))
    order = "concurrently" if run.args.sanitize_concurrent else "one after the other"
    run.section_markdown("sanitize", "## compute-sanitizer\n\n"
                         f"`compute-sanitizer --tool TOOL --error-exitcode {SANITIZER_EXIT}` on "
                         "`scripts/gpu_bench.py --sanitize-case` (block_lstm + block_lstm_grad and LSTMCell "
                         f"run/vjp, shapes (T,B,I,H) {', '.join(shape_label(s) for s in shapes)}, every "
                         "loop variant and precision, checked against the CPU target); "
                         f"timeout {timeout:.0f} s each, {order}. "
                         f"Exit status {SANITIZER_EXIT}: the sanitizer reported errors; 3: a case failed or did not "
                         "match the CPU. Logs: `sanitize_TOOL.log`.\n\n"
                         + markdown_table(("tool", "exit status", "summary", "cases", "seconds"), rows))
    return data


def _wait_tool(entry, timeout):
    """Wait for one sanitizer process (once); ``(exit status or "timeout", seconds)``."""
    proc, handle, _, _, _, started = entry
    if proc.returncode is None:
        left = max(1.0, timeout - (time.monotonic() - started))
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
            proc.timed_out = True
    handle.close()
    seconds = round(time.monotonic() - started, 1)
    return ("timeout" if getattr(proc, "timed_out", False) else proc.returncode), seconds


# -- main -----------------------------------------------------------------------------------------------------------

FUNCTIONS = {"env": section_env, "ceilings": section_ceilings, "compare": section_compare,
             "profile": section_profile, "sanitize": section_sanitize}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="folder for the tables, logs and results.json (created)")
    p.add_argument("--sections", type=parse_sections, default=SECTIONS,
                   help=f"comma-separated, from {','.join(SECTIONS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="one shape, few repetitions, shorter budgets")
    p.add_argument("--shapes", type=parse_shapes, default=None, help="T,B,I,H;T,B,I,H... (default: the five)")
    p.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds for the whole run")
    p.add_argument("--target-s", type=float, default=None, help="seconds of repetitions per measurement")
    p.add_argument("--min-reps", type=int, default=None)
    p.add_argument("--max-reps", type=int, default=None)
    p.add_argument("--warmups", type=int, default=None, help="untimed calls before each measurement (default 1)")
    p.add_argument("--sanitize-tools", default=",".join(SANITIZE_TOOLS), type=lambda s: tuple(s.split(",")),
                   help="compute-sanitizer tools (default: memcheck,racecheck,synccheck)")
    p.add_argument("--sanitize-timeout", type=float, default=SANITIZE_TIMEOUT_S)
    p.add_argument("--sanitize-serial", dest="sanitize_concurrent", action="store_false",
                   help="run the sanitizer tools one after the other")
    p.add_argument("--sim-smoke", action="store_true",
                   help="a tiny shape with Numba device arrays, no PyTorch (runs in the CUDA simulator)")
    p.add_argument("--no-watchdog", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sanitize-case", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sanitize-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = argv
    if args.shapes is None:
        args.shapes = SMOKE_SHAPES if args.sim_smoke else QUICK_SHAPES if args.quick else SHAPES
    few = args.quick or args.sim_smoke
    args.target_s = args.target_s if args.target_s is not None else (0.05 if few else 0.25)
    args.min_reps = args.min_reps if args.min_reps is not None else (1 if args.sim_smoke else 2 if few else 5)
    args.max_reps = args.max_reps if args.max_reps is not None else (1 if args.sim_smoke else 5 if few else 200)
    args.min_reps = min(args.min_reps, args.max_reps)
    if args.warmups is None:
        args.warmups = 0 if args.sim_smoke else 1
    if not args.sanitize_case and not args.out:
        p.error("--out DIR is required")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.sanitize_case:
        shapes = SANITIZE_QUICK_SHAPES if args.quick else SANITIZE_SHAPES
        result = sanitize_case(shapes, out=args.sanitize_out)
        return 0 if result["failures"] == 0 else 3
    if not args.no_watchdog:
        # A hung CUDA call would keep the process forever: dump the stacks and end it (results.json is
        # rewritten after each section, so what was measured stays).
        faulthandler.dump_traceback_later(args.budget + TOTAL_GRACE_S, exit=True)
    run = Run(args)
    run.log(f"gpu_bench: sections {','.join(args.sections)}, shapes {[shape_label(s) for s in args.shapes]}, "
            f"budget {args.budget:.0f} s, out {run.out}")
    try:
        run_sections(run, args.sections, FUNCTIONS)
    finally:
        faulthandler.cancel_dump_traceback_later()
        run.data["seconds"] = round(run.elapsed(), 1)
        run.save()
    failed = [n for n, r in run.data["sections"].items() if r["status"] == "error"]
    run.log(f"gpu_bench: done in {run.elapsed():.0f} s; " + (f"failed sections: {', '.join(failed)}" if failed
                                                             else "no section failed")
            + f"; results in {run.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
