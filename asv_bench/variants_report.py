"""What options and dtypes cost: nblstm's CPU kernels against their own plain float32 case.

Times, in one process and interleaved round by round (medians), the plain
float32 forward and backward of the fused ops next to the same calls in
float16 and float64 and with peepholes and cell clipping; a whole-sequence
:class:`nblstm.LSTMCell` without options next to one with peepholes, cell
clipping, a projection with ``proj_clip`` and per-example lengths; and the
large shape's forward rate next to the rate of NumPy's (multi-threaded) sgemm
on its input projection, ``(T*B, I) x (I, 4H)``, the two timed back to back
in every round.

Run it with the interpreter whose nblstm is to be timed::

    python asv_bench/variants_report.py --rounds 15

It writes ``docs/variants.md`` (``--markdown`` to change) and prints it.
"""

import argparse
import datetime
import pathlib
import statistics
import sys
import time

import numpy as np

import nblstm

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "asv_bench"))

from peer_compare import _machine  # noqa: E402 - one description of the machine for every report

SHAPE = (50, 32, 256, 256)
LARGE = (25, 64, 1024, 1024)
GEMM = "NumPy sgemm (T*B, I) x (I, 4H) of the large shape"


def _problem(shape, dtype, seed=0):
    steps, batch, inputs, units = shape
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((steps, batch, inputs)).astype(dtype),
        "c": np.zeros((batch, units), dtype),
        "w": (rng.standard_normal((inputs + units, 4 * units)) / np.sqrt(inputs + units)).astype(dtype),
        "b": np.zeros(4 * units, dtype),
        "p": (0.1 * rng.standard_normal(units)).astype(dtype),
        "dh": rng.standard_normal((steps, batch, units)).astype(dtype),
    }


def forward_flops(shape, proj=None):
    """Multiply-adds x 2 of a forward pass (the GEMMs), with an optional projection to ``proj`` units."""
    steps, batch, inputs, units = shape
    depth = proj or units
    flops = 2 * steps * batch * (inputs + depth) * 4 * units
    return flops + (2 * steps * batch * units * proj if proj else 0)


def cases():
    """``{name: (call, flops)}``: every case, set up and called once (compiled)."""
    out = {}
    for dtype in (np.float32, np.float16, np.float64):
        a = _problem(SHAPE, dtype)
        name = np.dtype(dtype).name
        fwd = nblstm.block_lstm(a["x"], a["c"], a["c"], a["w"], a["b"])
        out[f"forward, {name}"] = (lambda a=a: nblstm.block_lstm(a["x"], a["c"], a["c"], a["w"], a["b"]),
                                   forward_flops(SHAPE))
        out[f"backward, {name}"] = (
            lambda a=a, fwd=fwd: nblstm.block_lstm_grad(a["x"], a["c"], a["c"], a["w"], fwd, None, a["dh"]),
            2 * forward_flops(SHAPE))
    a = _problem(SHAPE, np.float32)
    peep = (a["p"], a["p"], a["p"])
    fwd = nblstm.block_lstm(a["x"], a["c"], a["c"], a["w"], a["b"], *peep, cell_clip=3.0, use_peephole=True)
    out["forward, float32, peepholes + cell_clip"] = (
        lambda: nblstm.block_lstm(a["x"], a["c"], a["c"], a["w"], a["b"], *peep, cell_clip=3.0, use_peephole=True),
        forward_flops(SHAPE))
    out["backward, float32, peepholes"] = (
        lambda: nblstm.block_lstm_grad(a["x"], a["c"], a["c"], a["w"], fwd, None, a["dh"], *peep, use_peephole=True),
        2 * forward_flops(SHAPE))
    steps, batch, _, units = SHAPE
    lengths = np.random.default_rng(1).integers(steps // 2, steps + 1, batch)
    plain = nblstm.LSTMCell(units, dtype=np.float32, seed=0)
    full = nblstm.LSTMCell(units, use_peepholes=True, cell_clip=3.0, num_proj=units // 2, proj_clip=2.0,
                           dtype=np.float32, seed=0)
    out["LSTMCell.run, float32"] = (lambda: plain.run(a["x"]), forward_flops(SHAPE))
    out["LSTMCell.run, float32, peepholes + cell_clip + num_proj=H/2 + proj_clip + lengths"] = (
        lambda: full.run(a["x"], sequence_length=lengths), forward_flops(SHAPE, units // 2))
    big = _problem(LARGE, np.float32)
    out["large forward, float32"] = (lambda: nblstm.block_lstm(big["x"], big["c"], big["c"], big["w"], big["b"]),
                                     forward_flops(LARGE))
    for call, _ in out.values():
        call()
    return out


def _time(call, min_time):
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def measure(rounds, min_time):
    """``({name: (median seconds, flops)}, share)``; each round times every case for ``min_time`` seconds at least.

    ``share`` is the median over rounds of the large forward's rate over
    NumPy's sgemm rate, the two timed back to back in each round (into a
    preallocated result: the rate of the GEMM, not of faulting in its
    output). The sgemm runs last in a round and is followed by a pause:
    its BLAS threads spin for a while after each call and would slow down
    whatever ran next.
    """
    table = cases()
    big = _problem(LARGE, np.float32)
    x2d = big["x"].reshape(-1, LARGE[2])
    w_in = np.ascontiguousarray(big["w"][:LARGE[2]])
    product = np.empty((x2d.shape[0], w_in.shape[1]), np.float32)
    gemm_flops = 2 * x2d.shape[0] * w_in.size
    large_call, large_flops = table["large forward, float32"]
    samples = {name: [] for name in (*table, GEMM)}
    shares = []
    first_call = next(iter(table.values()))[0]
    for _ in range(rounds):
        # Untimed, after the pause: the first case timed in a round ran up to
        # 1.3x slower than the same case later in the round.
        _time(first_call, min_time / 2)
        for name, (call, _) in table.items():
            samples[name].append(_time(call, min_time))
        large = _time(large_call, min_time)
        gemm = _time(lambda: np.dot(x2d, w_in, product), min_time)
        samples[GEMM].append(gemm)
        shares.append((large_flops / large) / (gemm_flops / gemm))
        time.sleep(0.5)
    results = {name: (statistics.median(samples[name]), table[name][1]) for name in table}
    results[GEMM] = (statistics.median(samples[GEMM]), gemm_flops)
    return results, statistics.median(shares)


def markdown(results, share, rounds):
    """The Markdown report."""
    def ratio(name, base):
        return f"{results[name][0] / results[base][0]:.2f}"

    import numba

    lines = [
        "# Options and dtypes: what they cost",
        "",
        f"Generated by `asv_bench/variants_report.py` on {datetime.date.today().isoformat()}: {_machine()}; "
        f"nblstm {nblstm.__version__}, numba {numba.__version__} "
        f"({numba.get_num_threads()} threads), NumPy {np.__version__}.",
        "",
        f"(T, B, I, H) = {SHAPE} unless said; median of {rounds} interleaved rounds in one process. "
        "**vs plain** is the time over the plain float32 case of the same kind (forward, backward, cell).",
        "",
        "| case | ms | GFLOP/s | vs plain |",
        "|---|---|---|---|",
    ]
    bases = {"forward": "forward, float32", "backward": "backward, float32", "LSTMCell": "LSTMCell.run, float32"}
    for name, (seconds, flops) in results.items():
        base = next((b for k, b in bases.items() if name.startswith(k)), None)
        lines.append(f"| {name} | {seconds * 1e3:.3g} | {flops / seconds / 1e9:.1f} | "
                     f"{ratio(name, base) if base else '-'} |")
    lines += ["", f"Large shape {LARGE}: the forward runs at {share:.0%} of the sgemm rate (median over rounds "
              "of the two timed back to back; sgemm into a preallocated result).", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds timed per case and round")
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "variants.md"), help="output file ('' for none)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    report = markdown(*measure(args.rounds, args.min_time), args.rounds)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(report)
    print(report)


if __name__ == "__main__":
    sys.exit(main())
