"""Time one streaming step of an LSTM: nblstm's stepper and calls against onnxruntime's LSTM node.

The case is a voice-activity detector's LSTM (Silero VAD's: ``H = 64`` or
``128`` units, inputs of the same size, batch 1, one step per audio chunk),
float32, plain (tanh, no peepholes, clipping or projection). In one process,
with the same weights:

- **onnxruntime**: an ONNX graph of one ``LSTM`` node (built here with
  ``onnx.helper``: gate order ``i, o, f, c``, ``B = [Wb, Rb]`` with
  ``forget_bias`` in ``Wb``), ``session.run`` for one step with the
  previous call's ``Y_h, Y_c`` fed back as ``initial_h, initial_c``;
  ``--ort-threads`` intra-op threads (default 1, as Silero's examples set).
- **nblstm stepper**: ``step = cell.stepper(); h = step(x_t)``.
- **nblstm LSTMCell**: ``output, state = cell(x_t, state)``.
- **nblstm block_lstm, T = 1**: ``nblstm.block_lstm(x_t[None], c, h, **cell.to_block_lstm())``
  with the state fed back.

First every path runs ``--check-steps`` steps from the same inputs and the
outputs are compared with onnxruntime's (float32 tolerance). Then, in
``--rounds`` interleaved rounds (the order of the paths rotates from round to
round), each path makes ``--calls`` calls, each timed alone with
``time.perf_counter_ns`` (which adds about 0.1 us to every path alike, as do
the feed-back of the state and the choice of the next input from a pool of
256); the garbage collector is off while timing. The table gives the median
and the 99th percentile over all calls of all rounds, and the ratio of
medians to onnxruntime's.

Needs onnxruntime and onnx (benchmark-only dependencies, not nblstm's)::

    python asv_bench/streaming_compare.py                    # writes docs/streaming.md
    python asv_bench/streaming_compare.py --rounds 3 --calls 2000 --markdown -
"""

import argparse
import datetime
import gc
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nblstm

import nblstm  # noqa: E402

sys.path.insert(0, str(ROOT / "asv_bench"))
from peer_compare import _machine  # noqa: E402 - one description of the machine for every report

#: (I, H): the VAD's LSTM sizes.
SHAPES = ((64, 64), (128, 128))
PATHS = ("onnxruntime", "stepper", "LSTMCell", "block_lstm")
LABELS = {
    "onnxruntime": "onnxruntime `session.run` (LSTM node)",
    "stepper": "nblstm `cell.stepper()` call",
    "LSTMCell": "nblstm `LSTMCell.__call__`",
    "block_lstm": "nblstm `block_lstm`, T = 1",
}
#: Inputs cycled through by every path.
POOL = 256


def onnx_lstm_model(cell):
    """An ONNX model of one LSTM node with ``cell``'s weights (tanh, no peepholes, clip or projection).

    nblstm's ``kernel [I + H, 4H]`` has ICFO gate columns (``i, j, f, o``);
    ONNX's ``W [1, 4H, I]`` and ``R [1, 4H, H]`` have the gates' rows in the
    order ``i, o, f, c``, and ``B [1, 8H]`` is ``[Wb, Rb]``: the bias, with
    ``forget_bias`` added to the forget gate's, goes to ``Wb``; ``Rb`` is zero.
    """
    import onnx
    from onnx import TensorProto, helper

    weights = cell.get_weights()
    units, inputs = cell.num_units, cell.input_depth
    kernel, bias = weights["kernel"], weights["bias"].astype(np.float32).copy()
    icfo = {"i": 0, "c": 1, "f": 2, "o": 3}
    order = [icfo[g] for g in "iofc"]
    bias[2 * units : 3 * units] += np.float32(cell.forget_bias)

    def gate_rows(matrix):
        return np.concatenate([matrix[:, k * units : (k + 1) * units].T for k in order])[None]

    w = gate_rows(kernel[:inputs]).astype(np.float32)
    r = gate_rows(kernel[inputs:]).astype(np.float32)
    b = np.concatenate(
        [np.concatenate([bias[k * units : (k + 1) * units] for k in order]), np.zeros(4 * units, np.float32)]
    )[None]
    initializers = [
        helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.ravel()) for name, a in (("W", w), ("R", r), ("B", b))
    ]
    node = helper.make_node(
        "LSTM", ["X", "W", "R", "B", "", "initial_h", "initial_c"], ["", "Y_h", "Y_c"], hidden_size=units
    )
    graph = helper.make_graph(
        [node],
        "lstm_step",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, inputs]),
            helper.make_tensor_value_info("initial_h", TensorProto.FLOAT, [1, 1, units]),
            helper.make_tensor_value_info("initial_c", TensorProto.FLOAT, [1, 1, units]),
        ],
        [
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 1, units]),
            helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, [1, 1, units]),
        ],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    return model


def ort_session(model, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def make_paths(cell, session, xs):
    """``{path: step()}``: each call runs one step of the next input and keeps the new state."""
    units = cell.num_units
    xs3 = [x[None] for x in xs]  # [1, B, I] views
    block_args = cell.to_block_lstm()
    counter = {name: 0 for name in PATHS}
    feed = {
        "X": xs3[0],
        "initial_h": np.zeros((1, 1, units), np.float32),
        "initial_c": np.zeros((1, 1, units), np.float32),
    }
    names = ["Y_h", "Y_c"]

    def ort_step():
        k = counter["onnxruntime"] = counter["onnxruntime"] + 1
        feed["X"] = xs3[k % POOL]
        feed["initial_h"], feed["initial_c"] = session.run(names, feed)
        return feed["initial_h"][0]

    step = cell.stepper(batch_size=1)

    def stepper_step():
        k = counter["stepper"] = counter["stepper"] + 1
        return step(xs[k % POOL])

    cell_state = [cell.zero_state(1, np.float32)]

    def cell_step():
        k = counter["LSTMCell"] = counter["LSTMCell"] + 1
        output, cell_state[0] = cell(xs[k % POOL], cell_state[0])
        return output

    block_state = [np.zeros((1, units), np.float32), np.zeros((1, units), np.float32)]

    def block_step():
        k = counter["block_lstm"] = counter["block_lstm"] + 1
        out = nblstm.block_lstm(xs3[k % POOL], block_state[0], block_state[1], **block_args)
        block_state[0], block_state[1] = out.cs[0], out.h[0]
        return out.h[0]

    def reset():
        for name in counter:
            counter[name] = -1
        feed["initial_h"] = np.zeros((1, 1, units), np.float32)
        feed["initial_c"] = np.zeros((1, 1, units), np.float32)
        step.reset()
        cell_state[0] = cell.zero_state(1, np.float32)
        block_state[0], block_state[1] = np.zeros((1, units), np.float32), np.zeros((1, units), np.float32)

    return {"onnxruntime": ort_step, "stepper": stepper_step, "LSTMCell": cell_step, "block_lstm": block_step}, reset


def check(paths, reset, steps):
    """Max |difference| from onnxruntime's outputs over ``steps`` steps, per nblstm path."""
    reset()
    outputs = {name: np.stack([np.array(fn(), np.float64) for _ in range(steps)]) for name, fn in paths.items()}
    reset()
    reference = outputs["onnxruntime"]
    return {name: float(np.abs(out - reference).max()) for name, out in outputs.items() if name != "onnxruntime"}


def time_calls(fn, calls):
    """Each of ``calls`` calls of ``fn`` timed alone: an array of nanoseconds."""
    times = np.empty(calls, np.int64)
    clock = time.perf_counter_ns
    for k in range(calls):
        start = clock()
        fn()
        times[k] = clock() - start
    return times


def measure(shapes, rounds, calls, threads, check_steps, seed=0):
    results, checks = {}, {}
    cases = []
    for inputs, units in shapes:
        cell = nblstm.LSTMCell(units, seed=seed, dtype=np.float32)
        cell.build(inputs)
        weights = cell.get_weights()
        rng = np.random.default_rng(seed)
        weights["bias"] = (0.1 * rng.standard_normal(weights["bias"].shape)).astype(np.float32)
        cell.set_weights(weights)
        xs = [x for x in rng.standard_normal((POOL, 1, inputs)).astype(np.float32)]  # [1, I] each
        session = ort_session(onnx_lstm_model(cell), threads)
        paths, reset = make_paths(cell, session, xs)
        checks[inputs, units] = check(paths, reset, check_steps)
        for fn in paths.values():  # warm-up: compiled (or loaded from numba's cache), caches filled
            for _ in range(200):
                fn()
        cases.append(((inputs, units), paths))
        for name in PATHS:
            results[inputs, units, name] = []
    gc.disable()
    try:
        for r in range(rounds):
            for shape, paths in cases:
                order = PATHS[r % len(PATHS) :] + PATHS[: r % len(PATHS)]
                for name in order:
                    results[(*shape, name)].append(time_calls(paths[name], calls))
    finally:
        gc.enable()
    return results, checks


def _versions():
    import numba
    import onnx
    import onnxruntime

    return (
        f"nblstm {nblstm.__version__}, numba {numba.__version__}, NumPy {np.__version__}, onnxruntime "
        f"{onnxruntime.__version__}, onnx {onnx.__version__}, Python {platform.python_version()}"
    )


def markdown(results, checks, args):
    lines = [
        "# Streaming: one LSTM step against onnxruntime",
        "",
        "A streaming model runs its LSTM one step at a time, a call per input chunk: the LSTM of Silero's "
        "voice-activity detector, for example, has `H = 64` or `128` units, batch 1 and one step per "
        "512-sample audio chunk. At these sizes the arithmetic of a step takes a few microseconds, and what a "
        "call costs around it decides. For streaming, {meth}`nblstm.LSTMCell.stepper` is the API: it checks "
        "and packs the weights once and keeps the state, and each call checks `x_t` and runs one compiled "
        "kernel, with the bits of `cell(x_t, state)` ({ref}`cell-streaming`). `LSTMCell.__call__` and the "
        "functional ops (`nblstm.block_lstm` with `T = 1`, `nblstm.lstm_block_cell`) validate every "
        "argument and pack the weights again at every call; users of the functional ops can stream through "
        "a cell with the same weights (`nblstm.convert.block_lstm_to_lstmcell`).",
        "",
        f"Generated by `asv_bench/streaming_compare.py` on {datetime.date.today().isoformat()}: {_machine()}. "
        f"{_versions()}.",
        "",
        f"Method: float32, batch 1, inputs `I = H`, a plain cell (tanh, no peepholes, clipping or projection; "
        f"random weights and bias, `forget_bias = 1`); onnxruntime runs an ONNX graph of one `LSTM` node with "
        f"the same weights (gate order `i, o, f, c`, `B = [Wb, Rb]`), {args.ort_threads} intra-op thread(s), "
        f"`session.run` with the previous call's `Y_h, Y_c` fed back. All paths run in one process: "
        f"{args.rounds} interleaved rounds (the order of the paths rotates) of {args.calls} calls per path and "
        "shape, each call timed alone (`time.perf_counter_ns`), after 200 warm-up calls, the garbage collector "
        "off; every call includes feeding back the state and taking the next input from a pool of 256 "
        "(about 0.1 us, alike for all paths). Median and 99th percentile over all calls; the ratio is of "
        "medians (below 1: faster than onnxruntime).",
        "",
        "| I, H | path | median (us) | p99 (us) | median / onnxruntime |",
        "|---|---|---|---|---|",
    ]
    for inputs, units in args.shapes:
        reference = np.median(np.concatenate(results[inputs, units, "onnxruntime"])) / 1e3
        for name in PATHS:
            times = np.concatenate(results[inputs, units, name]) / 1e3
            median, p99 = np.median(times), np.percentile(times, 99)
            ratio = "1" if name == "onnxruntime" else f"{median / reference:.2f}"
            lines.append(f"| {inputs}, {units} | {LABELS[name]} | {median:.1f} | {p99:.1f} | {ratio} |")
    lines += ["", "Per-round medians (us), in round order:", ""]
    for inputs, units in args.shapes:
        for name in PATHS:
            rounds = ", ".join(f"{np.median(t) / 1e3:.1f}" for t in results[inputs, units, name])
            lines.append(f"- {inputs}, {units}, {name}: {rounds}")
    worst = max(max(c.values()) for c in checks.values())
    lines += [
        "",
        f"Check: over {args.check_steps} steps from the same inputs, every nblstm path's outputs agree "
        f"with onnxruntime's to {worst:.1e} at most (absolute; float32).",
        "",
    ]
    return "\n".join(lines)


def _shape(text):
    try:
        inputs, units = (int(n) for n in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is IxH, e.g. 128x128; got {text!r}") from None
    return inputs, units


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", type=_shape, default=list(SHAPES), help="IxH, default 64x64 128x128")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--calls", type=int, default=3000, help="calls per path, shape and round (default 3000)")
    parser.add_argument("--ort-threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    parser.add_argument("--check-steps", type=int, default=300, help="steps compared with onnxruntime (300)")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest |difference| accepted (1e-5)")
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "streaming.md"), help="output, '-' for stdout")
    args = parser.parse_args(argv)
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as err:
        parser.exit(2, f"this benchmark needs onnxruntime and onnx ({err}): pip install onnxruntime onnx\n")
    results, checks = measure(args.shapes, args.rounds, args.calls, args.ort_threads, args.check_steps)
    for shape, diffs in checks.items():
        for name, diff in diffs.items():
            if not diff <= args.tolerance:
                parser.exit(1, f"{name} at I, H = {shape} differs from onnxruntime by {diff:.3g}\n")
    text = markdown(results, checks, args)
    if args.markdown == "-":
        print(text)
    else:
        pathlib.Path(args.markdown).write_text(text)
        print(text)


if __name__ == "__main__":
    main()
