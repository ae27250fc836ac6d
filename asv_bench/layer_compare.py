"""Time a 2-layer bidirectional ``nblstm.LSTM`` with lengths against ``torch.nn.LSTM`` on a packed sequence.

What is timed, float32, time-major ``x [T, B, I]``, lengths ``L [B]`` drawn
uniformly in ``[T / 2, T]`` (fixed seed), the same weights in both:

======= ================================================= ==================================================
library forward                                           forward + backward
======= ================================================= ==================================================
nblstm  ``lstm(x, sequence_length=L)``                    ``(out, _), backward = lstm.vjp(x,
                                                          sequence_length=L)``; ``backward(R)``
PyTorch ``pack_padded_sequence(x, L,                      the same with autograd (``x`` requires grad), then
        enforce_sorted=False)``, ``lstm(packed)``,        ``(out * R).sum().backward()``
        ``pad_packed_sequence(.., total_length=T)``,
        under ``torch.no_grad()``
======= ================================================= ==================================================

with ``nblstm.LSTM(I, H, num_layers=2, bidirectional=True)`` and
``torch.nn.LSTM(I, H, num_layers=2, bidirectional=True)``. Both return the
padded ``[T, B, 2H]`` output (zero past each length) and the final states at
each example's length; both backward passes give the gradients of the input
and of every weight (nblstm's also those of the initial state). ``R [T, B, 2H]``
is a fixed random output gradient. PyTorch's weights (gates ``i, f, g, o``,
two biases) are copied into nblstm's cells with
:meth:`nblstm.LSTM.set_cell_weights` (kernel ``[I + H, 4H]``, gate columns
``i, j = g, f, o``; bias ``b_ih + b_hh``).

For reference the same layers are also timed **without lengths**: ``lstm(x)``
and ``lstm.vjp(x)`` in nblstm, ``nn.LSTM`` on the padded tensor itself (not
packed) in PyTorch, which then runs oneDNN's fused RNN layer instead of its
step-by-step loop over a packed sequence.

Each library runs in a subprocess of its own (PyTorch's OpenMP threads and
nblstm's helper threads never share a process), with the same number of
threads: ``--threads``, default the CPUs this process may use (nblstm:
``numba.set_num_threads``; PyTorch: ``torch.set_num_threads``). Each of
``--rounds`` rounds starts a fresh worker process per library; for each
shape both make ``--warmup`` calls of each kind, then, for each kind,
``--blocks`` timed blocks of the two libraries alternate (which one goes
first alternates too), while the other process waits idle. A block is one
more warm-up call, then calls for ``--min-time`` seconds. Interleaving
blocks of about a second, rather than whole processes, lets both libraries
see the same load of a shared, noisy machine. The result is the median of
the block medians, the ratio nblstm's time over PyTorch's (below 1: nblstm
is faster); the ratios of the pairs of blocks timed next to each other are
reported too.

In the first round each worker also saves its results, and the driver
compares them (outputs, final states, the gradients of the input and of
every weight, in nblstm's layout): the run fails if they differ by more than
``--tolerance`` relative to the largest magnitude of each quantity.

``--breakdown`` times instead where nblstm's layer spends its time, in one
process: every cell's ``run`` / ``vjp`` and ``backward`` (per layer and
direction) and the layer's own glue (the concatenation of the directions'
outputs, the split of their gradients, the sum of the input gradients), and
the step schedule of the reverse direction (:mod:`nblstm.schedule`).

Usage (the workers need numpy and numba with this checkout's nblstm importable,
PyTorch's also torch)::

    python asv_bench/layer_compare.py                          # writes docs/layers-benchmark.md
    python asv_bench/layer_compare.py --shapes 50x32x128x128 --rounds 3 --markdown -
    python asv_bench/layer_compare.py --python /path/to/env-with-torch/bin/python
    python asv_bench/layer_compare.py --breakdown --shapes 50x64x256x256
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "asv_bench"))
from peer_compare import _fmt_ms, _machine, _time  # noqa: E402 - one description of the machine, one timer

#: (T, B, I, H) timed by default.
SHAPES = ((50, 32, 128, 128), (100, 16, 256, 256), (50, 64, 256, 256))
LIBRARIES = ("nblstm", "torch")
LABELS = {"nblstm": "nblstm", "torch": "PyTorch"}
#: Timed kinds of call: with the lengths (the comparison), and ``_full`` without them (every example ``T``
#: steps; PyTorch on the padded tensor, not packed), for reference.
METRICS = ("fwd", "fwd_bwd", "fwd_full", "fwd_bwd_full")
NUM_LAYERS = 2
#: PyTorch's gate blocks (i, f, g, o) in nblstm's column order (i, j = g, f, o).
TORCH_TO_ICFO = (0, 2, 1, 3)


def _default_threads():
    if "NUMBA_NUM_THREADS" in os.environ:
        return int(os.environ["NUMBA_NUM_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# --------------------------------------------------------------------------
# The problem: the same arrays in every process
# --------------------------------------------------------------------------


def problem(shape, seed=0):
    """The float32 inputs and PyTorch-layout weights of one shape (same seed, same values in every process).

    Returns a dict with ``x [T, B, I]``, ``lengths [B]`` int64 in ``[T / 2, T]``,
    the output gradient ``r [T, B, 2H]`` and ``torch``: ``nn.LSTM``'s state dict
    (``weight_ih_l0 [4H, I]``, ``weight_hh_l0 [4H, H]``, ``bias_ih_l0, bias_hh_l0
    [4H]``, ``..._reverse``, ``..._l1``: layer 1 reads ``2H`` inputs), uniform in
    ``±1 / sqrt(H)`` as PyTorch initialises them.
    """
    import numpy as np

    T, B, I, H = shape
    rng = np.random.default_rng(seed)
    f32 = np.float32
    bound = 1.0 / np.sqrt(H)
    weights = {}
    for layer in range(NUM_LAYERS):
        inputs = I if layer == 0 else 2 * H
        for suffix in ("", "_reverse"):
            for name, n in (("weight_ih", inputs), ("weight_hh", H)):
                weights[f"{name}_l{layer}{suffix}"] = rng.uniform(-bound, bound, (4 * H, n)).astype(f32)
            for name in ("bias_ih", "bias_hh"):
                weights[f"{name}_l{layer}{suffix}"] = rng.uniform(-bound, bound, 4 * H).astype(f32)
    lengths = rng.integers(T // 2, T + 1, B).astype(np.int64)
    lengths[rng.integers(B)] = T  # the longest is T: PyTorch's padded output is then [T, B, 2H] as nblstm's
    return {
        "x": rng.standard_normal((T, B, I)).astype(f32),
        "lengths": lengths,
        "r": (rng.standard_normal((T, B, 2 * H)) * 0.1).astype(f32),
        "torch": weights,
    }


def _icfo_columns(a, units):
    """``[..., 4H]`` gate blocks reordered from PyTorch's ``i, f, g, o`` to nblstm's ``i, j, f, o``."""
    import numpy as np

    return np.concatenate([a[..., k * units:(k + 1) * units] for k in TORCH_TO_ICFO], axis=-1)


def cells_from_torch(weights, hidden):
    """nblstm cell weight dicts (``kernel [I + H, 4H]``, ``bias [4H]``) in ``nblstm.LSTM.cells`` order."""
    import numpy as np

    cells = []
    for layer in range(NUM_LAYERS):
        for suffix in ("", "_reverse"):
            key = f"l{layer}{suffix}"
            kernel = np.concatenate([weights[f"weight_ih_{key}"].T, weights[f"weight_hh_{key}"].T])
            bias = weights[f"bias_ih_{key}"] + weights[f"bias_hh_{key}"]
            cells.append({"kernel": np.ascontiguousarray(_icfo_columns(kernel, hidden)),
                          "bias": np.ascontiguousarray(_icfo_columns(bias, hidden))})
    return cells


def grads_from_torch(grads, hidden):
    """PyTorch's weight gradients in nblstm's names and layout (``l0/kernel``, ``l0/bias``, ``l0_reverse/...``)."""
    import numpy as np

    out = {}
    for layer in range(NUM_LAYERS):
        for suffix in ("", "_reverse"):
            key = f"l{layer}{suffix}"
            kernel = np.concatenate([grads[f"weight_ih_{key}"].T, grads[f"weight_hh_{key}"].T])
            out[f"{key}/kernel"] = _icfo_columns(kernel, hidden)
            # bias = b_ih + b_hh: its gradient is either one's (they are equal).
            out[f"{key}/bias"] = _icfo_columns(grads[f"bias_ih_{key}"], hidden)
    return out


# --------------------------------------------------------------------------
# Workers: one library each, in a subprocess; print JSON
# --------------------------------------------------------------------------


def _setup_nblstm(shape, threads):
    """``({metric: fn}, results(), info)`` of nblstm's layer on ``shape``."""
    sys.path.insert(0, str(ROOT))  # this checkout's nblstm
    import numba
    import numpy as np

    import nblstm

    numba.set_num_threads(threads)
    T, B, I, H = shape
    p = problem(shape)
    x, lengths, r = p["x"], p["lengths"], p["r"]
    lstm = nblstm.LSTM(I, H, num_layers=NUM_LAYERS, bidirectional=True)
    lstm.set_cell_weights(cells_from_torch(p["torch"], H))

    def fwd():
        return lstm(x, sequence_length=lengths)

    def fwd_bwd(lengths=lengths):
        (out, state), backward = lstm.vjp(x, sequence_length=lengths)
        return out, state, backward(r)

    def fwd_full():
        return lstm(x)

    def fwd_bwd_full():
        return fwd_bwd(None)

    def results():
        res = {}
        for prefix, lens in (("", lengths), ("full/", None)):
            out, (h_n, c_n), (d_x, _, d_w) = fwd_bwd(lens)
            if not np.array_equal(lstm(x, sequence_length=lens)[0], out):
                raise AssertionError("nblstm: the output of vjp differs from the call's")
            res.update({f"{prefix}{k}": a for k, a in (("output", out), ("h_n", h_n), ("c_n", c_n), ("d_x", d_x))})
            res.update({f"{prefix}d_w/{k}": a for k, a in d_w.items()})
        return res

    info = {"version": nblstm.__version__, "numba": numba.__version__, "numpy": np.__version__,
            "threads": numba.get_num_threads()}
    return {"fwd": fwd, "fwd_bwd": fwd_bwd, "fwd_full": fwd_full, "fwd_bwd_full": fwd_bwd_full}, results, info


def _setup_torch(shape, threads):
    """``({metric: fn}, results(), info)`` of ``torch.nn.LSTM`` on a packed sequence of ``shape``."""
    import numpy as np
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.set_num_threads(threads)
    T, B, I, H = shape
    p = problem(shape)
    lstm = torch.nn.LSTM(I, H, num_layers=NUM_LAYERS, bidirectional=True)
    with torch.no_grad():
        for name, param in lstm.named_parameters():
            param.copy_(torch.from_numpy(p["torch"][name]))
    x = torch.from_numpy(p["x"])
    lengths = torch.from_numpy(p["lengths"])
    r = torch.from_numpy(p["r"])
    x_train = x.clone().requires_grad_(True)
    params = list(lstm.parameters())

    def fwd():
        with torch.no_grad():
            out, (h_n, c_n) = lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
            return pad_packed_sequence(out, total_length=T)[0], h_n, c_n

    def fwd_bwd(packed=True):
        for param in params:
            param.grad = None
        x_train.grad = None
        if packed:
            out, (h_n, c_n) = lstm(pack_padded_sequence(x_train, lengths, enforce_sorted=False))
            out = pad_packed_sequence(out, total_length=T)[0]
        else:
            out, (h_n, c_n) = lstm(x_train)
        (out * r).sum().backward()
        return out, h_n, c_n

    def fwd_full():
        with torch.no_grad():
            return lstm(x)

    def fwd_bwd_full():
        return fwd_bwd(False)

    def results():
        res = {}
        for prefix, packed, forward in (("", True, fwd), ("full/", False, fwd_full)):
            out, h_n, c_n = fwd_bwd(packed)
            grads = {name: param.grad.numpy() for name, param in lstm.named_parameters()}
            res.update({f"{prefix}output": out.detach().numpy(), f"{prefix}h_n": h_n.detach().numpy(),
                        f"{prefix}c_n": c_n.detach().numpy(), f"{prefix}d_x": x_train.grad.numpy()})
            res.update({f"{prefix}d_w/{k}": a for k, a in grads_from_torch(grads, H).items()})
            if not np.allclose(forward()[0].numpy(), res[f"{prefix}output"], rtol=0, atol=1e-5):
                raise AssertionError("PyTorch: the training forward's output differs from the no-grad forward's")
        return res

    info = {"version": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available())}
    return {"fwd": fwd, "fwd_bwd": fwd_bwd, "fwd_full": fwd_full, "fwd_bwd_full": fwd_bwd_full}, results, info


SETUPS = {"nblstm": _setup_nblstm, "torch": _setup_torch}


def serve(library, args):
    """A worker's loop: one JSON command a line on stdin, one JSON reply a line on stdout.

    Commands: ``{"op": "setup", "shape": [T, B, I, H], "save": dir or null}``
    (builds the case, saves its results with ``save``, makes ``--warmup`` calls
    of each kind), ``{"op": "time", "shape": ..., "metric": "fwd" or "fwd_bwd"}``
    (one warm-up call, then calls for ``--min-time`` seconds: the seconds of
    each) and ``{"op": "quit"}``.
    """
    import numpy as np

    t0 = time.perf_counter()
    try:
        if library == "nblstm":
            sys.path.insert(0, str(ROOT))
        __import__(library)
    except ImportError as exc:
        print(json.dumps({"skipped": f"cannot import {library}: {exc}"}), flush=True)
        return
    print(json.dumps({"ready": True, "import_s": time.perf_counter() - t0}), flush=True)
    cases = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        shape = tuple(cmd["shape"])
        if cmd["op"] == "setup":
            t0 = time.perf_counter()
            fns, results, info = SETUPS[library](shape, args.threads)
            if cmd.get("save"):
                arrays = {k: np.asarray(a) for k, a in results().items()}
                np.savez(pathlib.Path(cmd["save"]) / f"{library}-{'x'.join(map(str, shape))}.npz", **arrays)
            for fn in fns.values():
                for _ in range(args.warmup):
                    fn()
            cases[shape] = fns
            reply = {"info": info, "setup_s": time.perf_counter() - t0}
        else:
            reply = {"samples": _time(cases[shape][cmd["metric"]], args.min_time, args.min_calls, args.max_calls)}
        print(json.dumps(reply), flush=True)


# --------------------------------------------------------------------------
# Breakdown: where nblstm's layer spends its time (one process)
# --------------------------------------------------------------------------


def _breakdown_items(shape, threads):
    """``[(group, name, fn, flops)]``: the layer's calls, each cell's, and the glue between them, on ``shape``."""
    sys.path.insert(0, str(ROOT))
    import numba
    import numpy as np

    import nblstm
    from nblstm import _validate as validate
    from nblstm import schedule as schedules
    from nblstm.cpu import regroup

    numba.set_num_threads(threads)
    T, B, I, H = shape
    p = problem(shape)
    x, lengths, r = p["x"], p["lengths"], p["r"]
    lstm = nblstm.LSTM(I, H, num_layers=NUM_LAYERS, bidirectional=True)
    lstm.set_cell_weights(cells_from_torch(p["torch"], H))
    steps_done = int(lengths.sum())
    items = [
        ("layer", "forward: lstm(x, sequence_length=L)", lambda: lstm(x, sequence_length=lengths), None),
        ("layer", "forward with saves: lstm.vjp(...) alone", lambda: lstm.vjp(x, sequence_length=lengths), None),
    ]

    def layer_fwd_bwd():
        backward = lstm.vjp(x, sequence_length=lengths)[1]
        return backward(r)

    items.append(("layer", "forward + backward: vjp, backward(R)", layer_fwd_bwd, None))
    rng = np.random.default_rng(1)
    # The kernels compute every row of every step (finished examples' rows are discarded); a packed
    # sequence computes the active rows only: as much arithmetic as a batch of sum(L) / T examples.
    full = np.full(B, T, np.int64)
    packed_batch = max(1, round(steps_done / T))
    x_packed = np.ascontiguousarray(x[:, :packed_batch])
    r_packed = np.ascontiguousarray(r[:, :packed_batch])
    for label, inp, lens, grad in ((f"lengths T (all {B} rows active)", x, full, r),
                                   (f"[T, {packed_batch}, I], lengths T (the active rows' arithmetic)", x_packed,
                                    None, r_packed)):
        def run_as(inp=inp, lens=lens):
            return lstm(inp, sequence_length=lens)

        def fwd_bwd_as(inp=inp, lens=lens, grad=grad):
            return lstm.vjp(inp, sequence_length=lens)[1](grad)

        items += [("layer", f"forward, {label}", run_as, None),
                  ("layer", f"forward + backward, {label}", fwd_bwd_as, None)]
    layer_in = x
    for layer in range(NUM_LAYERS):
        outs = []
        depth = layer_in.shape[2]
        d_out = np.ascontiguousarray(r[:, :, :H]) if layer == NUM_LAYERS - 1 else \
            (rng.standard_normal((T, B, H)) * 0.1).astype(np.float32)
        for d in range(2):
            cell = lstm.cells[layer * 2 + d]
            name = f"l{layer}{'_reverse' if d else ''}"
            flops = 2 * steps_done * (depth + H) * 4 * H

            def run(cell=cell, inp=layer_in, d=d):
                return cell.run(inp, None, lengths, reverse=bool(d))

            def vjp(cell=cell, inp=layer_in, d=d):
                return cell.vjp(inp, None, lengths, reverse=bool(d))

            def vjp_bwd(cell=cell, inp=layer_in, d=d, g=d_out):
                return cell.vjp(inp, None, lengths, reverse=bool(d))[1](g)

            items += [(f"cell {name} (I = {depth})", "run", run, flops),
                      (f"cell {name} (I = {depth})", "vjp forward", vjp, flops),
                      (f"cell {name} (I = {depth})", "vjp forward + backward", vjp_bwd, 3 * flops)]
            if d:
                def run_fwd_order(cell=cell, inp=layer_in):
                    return cell.run(inp, None, lengths, reverse=False)

                def vjp_bwd_fwd_order(cell=cell, inp=layer_in, g=d_out):
                    return cell.vjp(inp, None, lengths, reverse=False)[1](g)

                items += [(f"cell {name} (I = {depth})", "run in forward order (no schedule)", run_fwd_order, flops),
                          (f"cell {name} (I = {depth})", "vjp forward + backward in forward order (no schedule)",
                           vjp_bwd_fwd_order, 3 * flops)]
            outs.append(run()[0])
        layer_in = np.concatenate(outs, axis=2)
    # The glue, on arrays of the layer's sizes.
    outs = [rng.standard_normal((T, B, H)).astype(np.float32) for _ in range(2)]
    d_layer = rng.standard_normal((T, B, 2 * H)).astype(np.float32)
    d_x = [rng.standard_normal((T, B, 2 * H)).astype(np.float32) for _ in range(2)]
    finals = [rng.standard_normal((B, H)).astype(np.float32) for _ in range(4)]
    order = schedules.schedule(T, B, lengths, reverse=True)
    pre = rng.standard_normal((T, B, 4 * H)).astype(np.float32)
    gates = np.empty_like(pre)
    h = rng.standard_normal((T, B, H)).astype(np.float32)
    h_out = np.empty_like(h)
    h0 = np.zeros((B, H), np.float32)
    items += [
        ("glue (per layer)", "concatenate the directions' outputs [T, B, H] x 2", lambda: np.concatenate(outs, 2),
         None),
        ("glue (per layer)", "split the output gradient [T, B, 2H] into 2 x [T, B, H]",
         lambda: [np.ascontiguousarray(d_layer[:, :, k * H:(k + 1) * H]) for k in range(2)], None),
        ("glue (per layer)", "sum the directions' input gradients [T, B, 2H]", lambda: d_x[0] + d_x[1], None),
        ("glue (per call)", "stack h_n and c_n [4, B, H]", lambda: (np.stack(finals), np.stack(finals)), None),
        ("glue (per call)", "check the lengths", lambda: validate.check_lengths(lengths, T, B), None),
        ("schedule (reverse cells)", "build the schedule", lambda: schedules.schedule(T, B, lengths, reverse=True),
         None),
        ("schedule (reverse cells)", "gather the projection [T, B, 4H] into steps (forward)",
         lambda: regroup.gather(pre, order.time_of, gates), None),
        ("schedule (reverse cells)", "gather the outputs [T, B, H] back to times (forward)",
         lambda: regroup.gather(h, order.output_of, h_out), None),
        ("schedule (reverse cells)", "scatter the output gradient [T, B, H] into steps (backward)",
         lambda: regroup.scatter_add(h, order.output_of, h_out), None),
        ("schedule (reverse cells)", "gather the gate gradients [T, B, 4H] back to times (backward)",
         lambda: regroup.gather(pre, order.step_of, gates), None),
        ("schedule (reverse cells)", "gather the previous outputs [T, B, H] (backward)",
         lambda: regroup.gather(h, order.step_of, h_out, first=h0, shift=1), None),
    ]
    return items


def breakdown(args):
    """``{shape: [(group, name, seconds, flops, [round medians])]}``, interleaved rounds in this process."""
    out = {}
    for shape in args.shapes:
        items = _breakdown_items(shape, args.threads)
        for _, _, fn, _ in items:  # compiled (or loaded from numba's cache), caches filled
            for _ in range(args.warmup):
                fn()
        rounds = [[] for _ in items]
        for _ in range(args.rounds):
            for k, (_, _, fn, _) in enumerate(items):
                rounds[k].append(statistics.median(_time(fn, args.min_time / 4, args.min_calls, args.max_calls)))
        out[shape] = [(g, n, statistics.median(rs), f, rs) for (g, n, _, f), rs in zip(items, rounds, strict=True)]
        print(f"  {shape}: done", file=sys.stderr, flush=True)
    return out


def _derived(rows):
    """Sums and differences of the breakdown's rows: ``[(name, median seconds, min seconds)]``."""
    by = {(g.split(" (")[0], n): (med, min(rs)) for g, n, med, _, rs in rows}
    cells = [g.split(" (")[0] for g, n, _, _, _ in rows if g.startswith("cell ") and n == "run"]
    out = []
    for kind, layer_call in (("run", "forward: lstm(x, sequence_length=L)"),
                             ("vjp forward + backward", "forward + backward: vjp, backward(R)")):
        total = [sum(by[c, kind][j] for c in cells) for j in (0, 1)]
        layer = by["layer", layer_call]
        label = "forward" if kind == "run" else "forward + backward"
        out.append((f"{label}: the four cells' calls, summed", *total))
        out.append((f"{label}: the layer's call minus the four cells' (glue, checks, dispatch)",
                    layer[0] - total[0], layer[1] - total[1]))
        reverse = [c for c in cells if c.endswith("_reverse")]
        plain = "run in forward order (no schedule)" if kind == "run" else \
            "vjp forward + backward in forward order (no schedule)"
        extra = [sum(by[c, kind][j] - by[c, plain][j] for c in reverse) for j in (0, 1)]
        out.append((f"{label}: the reverse cells' time over the same cells in forward order (the schedule)",
                    *extra))
    return out


def breakdown_markdown(result, args):
    """The breakdown as Markdown tables, one per shape."""
    import numba
    import numpy as np

    import nblstm

    lines = [f"Breakdown of `nblstm.LSTM(I, H, num_layers=2, bidirectional=True)` with lengths "
             f"({datetime.date.today().isoformat()}, {_machine()}; nblstm {nblstm.__version__}, numba "
             f"{numba.__version__}, {args.threads} threads): every call timed in each of {args.rounds} "
             f"interleaved rounds in one process, for {args.min_time / 4:g} s a round; **ms** is the median of "
             "the rounds' medians, **min** the fastest round's (the least disturbed by other work). GFLOP/s "
             "(of the median) count the GEMMs of the active steps (forward `2 * sum(L) * (I + H) * 4H`, "
             "forward + backward 3x). The glue rows run on arrays of the layer's sizes.", ""]
    for shape, rows in result.items():
        lengths = problem(shape)["lengths"]
        lines += [f"### (T, B, I, H) = {shape}, mean length {float(np.mean(lengths)):.1f}", "",
                  "| part | call | ms | min ms | GFLOP/s | per-round ms |", "|---|---|---|---|---|---|"]
        for group, name, seconds, flops, rs in rows:
            rate = f"{flops / seconds / 1e9:.1f}" if flops else ""
            lines.append(f"| {group} | {name} | {_fmt_ms(seconds)} | {_fmt_ms(min(rs))} | {rate} | "
                         f"{', '.join(_fmt_ms(t) for t in rs)} |")
        for name, med, low in _derived(rows):
            lines.append(f"| derived | {name} | {med * 1e3:.3g} | {low * 1e3:.3g} | | |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def _parse_shape(text):
    parts = text.lower().replace(",", "x").split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"a shape is TxBxIxH, e.g. 50x32x128x128; got {text!r}")
    return tuple(int(p) for p in parts)


class WorkerError(RuntimeError):
    """A worker process ended or answered nothing readable."""


class Worker:
    """One library's worker process (:func:`serve`), asked one command at a time."""

    def __init__(self, python, library, args):
        self.library = library
        self.stderr = tempfile.TemporaryFile("w+")
        cmd = [python, str(pathlib.Path(__file__).resolve()), "--worker", library, "--threads", str(args.threads),
               "--warmup", str(args.warmup), "--min-time", str(args.min_time), "--min-calls", str(args.min_calls),
               "--max-calls", str(args.max_calls)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, cwd=ROOT)
        self.hello = self._reply()

    def _reply(self):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.stderr.seek(0)
                tail = " | ".join(self.stderr.read().strip().splitlines()[-5:])
                raise WorkerError(f"worker failed (exit {self.proc.returncode}): {tail}")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def collect(args, save):
    """Interleaved rounds of interleaved blocks.

    Every round starts a fresh worker process per library; for each shape and
    kind of call, ``--blocks`` blocks of each library alternate (the first
    library of a pair alternating too). Returns the block medians
    ``{library: {shape: {metric: [seconds]}}}`` in the order timed (entry ``k``
    of each library is one pair), the workers' infos and the libraries skipped.
    """
    shapes = args.shapes
    medians = {lib: {s: {m: [] for m in METRICS} for s in shapes} for lib in LIBRARIES}
    infos, skipped = {}, {}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        workers = {}
        try:
            for lib in LIBRARIES:
                if lib in skipped:
                    continue
                try:
                    w = Worker(args.python, lib, args)
                except WorkerError as exc:
                    skipped[lib] = str(exc)
                    continue
                if "skipped" in w.hello:
                    skipped[lib] = w.hello["skipped"]
                    w.close()
                    continue
                workers[lib] = w
            if not workers:
                break
            for shape in shapes:
                for lib, w in workers.items():
                    infos[lib] = w.ask(op="setup", shape=list(shape), save=save if r == 0 else None)["info"]
                for metric in METRICS:
                    for k in range(args.blocks):
                        order = list(workers) if (r * args.blocks + k) % 2 == 0 else list(workers)[::-1]
                        for lib in order:
                            samples = workers[lib].ask(op="time", shape=list(shape), metric=metric)["samples"]
                            medians[lib][shape][metric].append(statistics.median(samples))
        finally:
            for w in workers.values():
                w.close()
        for lib, reason in skipped.items():
            print(f"  {LABELS[lib]}: skipped ({reason})", flush=True)
        print(f"  round {r + 1}/{args.rounds}: {time.perf_counter() - t0:.1f} s", flush=True)
    return {"medians": medians, "infos": infos, "skipped": skipped}


def compare_results(save, shapes):
    """``{shape: {quantity: max |nblstm - PyTorch| / max |PyTorch|}}`` from the saved results."""
    import numpy as np

    out = {}
    for shape in shapes:
        name = "x".join(map(str, shape))
        files = [pathlib.Path(save) / f"{lib}-{name}.npz" for lib in LIBRARIES]
        if not all(f.exists() for f in files):
            continue
        ours, theirs = (np.load(f) for f in files)
        if set(ours.files) != set(theirs.files):
            raise AssertionError(f"{shape}: different results saved: {sorted(ours.files)} / {sorted(theirs.files)}")
        out[shape] = {}
        for key in ours.files:
            a, b = ours[key].astype(np.float64), theirs[key].astype(np.float64)
            if a.shape != b.shape:
                raise AssertionError(f"{shape}: {key} has shape {a.shape} in nblstm, {b.shape} in PyTorch")
            out[shape][key] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    return out


def _versions(infos):
    parts = []
    if "nblstm" in infos:
        i = infos["nblstm"]
        parts.append(f"nblstm {i['version']} (numba {i['numba']}, NumPy {i['numpy']}, {i['threads']} threads)")
    if "torch" in infos:
        i = infos["torch"]
        parts.append(f"PyTorch {i['version']} ({i['threads']} threads, {i['interop_threads']} inter-op; "
                     f"oneDNN {'available' if i['mkldnn'] else 'not available'})")
    return "; ".join(parts) + f"; Python {platform.python_version()}"


def _command(argv):
    shown = ["python asv_bench/layer_compare.py"]
    for a in argv:
        shown.append(a if not os.path.isabs(a) else pathlib.Path(a).name)
    return " ".join(shown)


def _paired(ours, theirs):
    """Median of the pairs' ratios ``ours[k] / theirs[k]`` and how many are below 1."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return statistics.median(ratios), sum(q < 1 for q in ratios), len(ratios)


def _table(shapes, metrics, med, blocks, with_lengths):
    """Markdown rows of one table: per shape, each metric's times, ratio and paired ratio."""
    import numpy as np

    kinds = ("fwd", "fwd+bwd")
    header = "| T, B, I, H | " + ("mean length | " if with_lengths else "") + " | ".join(
        f"nblstm {k} ms | PyTorch {k} ms | nblstm / PyTorch, {k} | paired, {k}" for k in kinds) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for shape in shapes:
        cells = [", ".join(map(str, shape))]
        if with_lengths:
            cells.append(f"{float(np.mean(problem(shape)['lengths'])):.1f}")
        for metric in metrics:
            ours, theirs = med["nblstm"][shape].get(metric), med["torch"][shape].get(metric)
            if ours and theirs:
                q, won, n = _paired(blocks["nblstm"][shape][metric], blocks["torch"][shape][metric])
                ratio = f"**{ours / theirs:.2f}**" if with_lengths else f"{ours / theirs:.2f}"
                cells += [_fmt_ms(ours), _fmt_ms(theirs), ratio, f"{q:.2f} ({won}/{n})"]
            else:
                cells += [_fmt_ms(ours) if ours else "-", _fmt_ms(theirs) if theirs else "-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(data, checks, args, argv):
    """The Markdown report."""
    blocks = data["medians"]
    med = {lib: {s: {m: statistics.median(v) for m, v in blocks[lib][s].items() if v} for s in args.shapes}
           for lib in LIBRARIES}
    load = data.get("load")
    lines = [
        "# Layers: a 2-layer bidirectional LSTM with lengths against PyTorch",
        "",
        f"Generated by `asv_bench/layer_compare.py` on {datetime.date.today().isoformat()}: {_machine()}. "
        f"{_versions(data['infos'])}.",
        "",
        "- **nblstm**: `nblstm.LSTM(I, H, num_layers=2, bidirectional=True)`; forward "
        "`lstm(x, sequence_length=L)`, forward + backward `lstm.vjp(x, sequence_length=L)` and "
        "`backward(R)` (gradients of the input, the initial state and every weight).",
        "- **PyTorch**: `torch.nn.LSTM(I, H, num_layers=2, bidirectional=True)` with the same weights, on "
        "`pack_padded_sequence(x, L, enforce_sorted=False)`, the output padded back with "
        "`pad_packed_sequence(out, total_length=T)`; forward under `torch.no_grad()`, forward + backward with "
        "`x.requires_grad` and `(out * R).sum().backward()` (gradients of the input and every weight).",
        "",
        f"Method: float32, time-major `x [T, B, I]`, lengths `L` uniform in `[T/2, T]` (fixed seed; the "
        f"longest is `T`), a fixed random output gradient `R [T, B, 2H]`. Each library runs in a process of its "
        f"own with {args.threads} threads (`numba.set_num_threads`, `torch.set_num_threads`). {args.rounds} "
        f"rounds, each with fresh processes; in each, every shape first makes {args.warmup} warm-up calls of "
        f"each kind in each library, then for each kind {args.blocks} blocks of each library alternate (which "
        f"library goes first alternates too), a block being one more warm-up call and then calls for at least "
        f"{args.min_time:g} s; the process not timing waits, idle. Times are the median of the "
        f"{args.rounds * args.blocks} block medians; **nblstm / PyTorch** is their ratio (below 1: nblstm is "
        "faster), **paired** the median of the ratios of the two blocks of each pair and how many pairs nblstm "
        "won (the pairs ran next to each other in time, so they share the machine's load of the moment).",
        "",
    ]
    if load:
        lines += [f"Load average (1 minute) of the machine at the start and end of the run: {load[0]:.2f}, "
                  f"{load[1]:.2f} (other work was not controlled).", ""]
    lines += _table(args.shapes, ("fwd", "fwd_bwd"), med, blocks, True)
    lines += [
        "",
        "For reference, the same layers **without lengths** (every example `T` steps: `lstm(x)` and "
        "`lstm.vjp(x)` in nblstm, `nn.LSTM` on the padded tensor itself, not packed, in PyTorch), timed in the "
        "same blocks. PyTorch runs a padded tensor through oneDNN's fused RNN layer (`aten::mkldnn_rnn_layer`) "
        "but a packed sequence with unequal lengths through its own loop over the steps (an `addmm` and the gate "
        "operations per step and direction); nblstm computes every example's rows at every step, finished or "
        "not, with or without lengths.",
        "",
    ]
    lines += _table(args.shapes, ("fwd_full", "fwd_bwd_full"), med, blocks, False)
    lines += ["", "Block medians (ms), in the order timed:", ""]
    names = {"fwd": "fwd", "fwd_bwd": "fwd+bwd", "fwd_full": "fwd without lengths",
             "fwd_bwd_full": "fwd+bwd without lengths"}
    for shape in args.shapes:
        for metric in METRICS:
            for lib in LIBRARIES:
                values = blocks[lib][shape][metric]
                if values:
                    lines.append(f"- {', '.join(map(str, shape))}, {names[metric]}, {LABELS[lib]}: "
                                 + ", ".join(_fmt_ms(t) for t in values))
    for lib, reason in data["skipped"].items():
        lines += ["", f"{LABELS[lib]} was skipped: {reason}"]
    if checks:
        worst = {}
        for per_shape in checks.values():
            for key, rel in per_shape.items():
                prefix, key = ("full/", key[5:]) if key.startswith("full/") else ("", key)
                group = prefix + ("weight gradients" if key.startswith("d_w/") else key)
                worst[group] = max(worst.get(group, 0.0), rel)
        names = {"output": "outputs", "h_n": "`h_n`", "c_n": "`c_n`", "d_x": "input gradient",
                 "weight gradients": "weight gradients"}

        def listed(prefix):
            return ", ".join(f"{names[k[len(prefix):]]} {v:.1e}" for k, v in worst.items()
                             if k.startswith(prefix) and (prefix or not k.startswith("full/")))

        lines += ["", "Check: nblstm's results agree with PyTorch's (largest difference over the largest magnitude "
                      f"of each quantity, all shapes): with lengths {listed('')}; without lengths "
                      f"{listed('full/')}."]
    lines += ["", f"Command: `{_command(argv)}`", ""]
    return "\n".join(lines)


def main(argv=None):
    """Command-line entry point (driver, ``--breakdown``, or with ``--worker`` one library's timing process)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", type=_parse_shape, default=list(SHAPES),
                        help="TxBxIxH shapes (default 50x32x128x128 100x16x256x256 50x64x256x256)")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the worker processes")
    parser.add_argument("--threads", type=int, default=_default_threads(),
                        help="threads of each library (default: the CPUs this process may use)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds, each with fresh worker processes (default 4)")
    parser.add_argument("--blocks", type=int, default=3,
                        help="alternating blocks per library, shape, kind and round (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls of each kind per shape and round")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds timed per block (default 0.5)")
    parser.add_argument("--min-calls", type=int, default=5)
    parser.add_argument("--max-calls", type=int, default=10000)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest relative difference from PyTorch's results accepted (default 1e-4)")
    parser.add_argument("--worker-timeout", type=float, default=1800.0, help="seconds before a worker is killed")
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "layers-benchmark.md"), help="output; '-': none")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the per-round medians here")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the parts of nblstm's layer (one process, nblstm only) instead")
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    parser.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if min(args.rounds, args.blocks) < 1:
        parser.error("--rounds and --blocks must be at least 1")

    if args.worker:
        serve(args.worker, args)
        return 0
    if args.breakdown:
        print(breakdown_markdown(breakdown(args), args))
        return 0

    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory() as save:
        data = collect(args, save)
        checks = compare_results(save, args.shapes)
    if load0 is not None:
        data["load"] = (load0, os.getloadavg()[0])
    text = markdown(data, checks, args, argv)
    print(text)
    bad = [(s, k, v) for s, per in checks.items() for k, v in per.items() if not v <= args.tolerance]
    if args.markdown != "-":
        pathlib.Path(args.markdown).write_text(text)
        print(f"wrote {args.markdown}")
    if args.json:
        serial = {"shapes": [list(s) for s in args.shapes], "infos": data["infos"], "skipped": data["skipped"],
                  "medians": {lib: {"x".join(map(str, s)): m for s, m in per.items()}
                              for lib, per in data["medians"].items()},
                  "checks": {"x".join(map(str, s)): c for s, c in checks.items()}}
        args.json.write_text(json.dumps(serial, indent=1))
    if bad:
        for shape, key, rel in bad:
            print(f"{key} at {shape} differs from PyTorch's by {rel:.2e} (relative; tolerance {args.tolerance:g})")
        return 1
    return 0 if not data["skipped"] else 2


if __name__ == "__main__":
    sys.exit(main())
