"""Behaviour snapshot of nblstm's public API: proof that a refactoring changes no result, bit for bit.

The script runs a fixed set of cases through the public API only (the
functional ops, :mod:`nblstm.raw_ops`, :class:`nblstm.LSTMCell`,
:mod:`nblstm.convert` and :mod:`nblstm.reference`) on inputs drawn from
fixed seeds, and keeps every result as ``{"case/output": ndarray}``.

Saved from the commit before the package's restructuring into folders, the
snapshot proves the restructured package computes the same bits: every
array must have the same dtype, shape and bytes (NaN payloads and signed
zeros included). The CPU cases cover both gate layouts, peepholes,
clipping, ``forget_bias``, ``seq_len_max < T`` and ``= 0``, float16,
float32 and float64, batch 1 and larger batches, shapes small enough to
run on one thread and large enough for the kernels to split their work
across threads, per-example lengths of the cell, non-contiguous and
read-only inputs. ``--cudasim`` runs the GPU path instead, in Numba's CUDA
simulator, on a few very small cases.

Bitwise results depend on the machine and the libraries (LLVM's code for
the CPU, the BLAS of SciPy, NumPy's own maths), so a snapshot is checked on
the machine and environment that saved it; the metadata saved with it say
which. They also depend on numba's thread count, for the backward passes of
the large cases (their work is split in one block per thread, which changes
the order of some sums; the forward results do not), so ``--check`` runs on
the thread count the snapshot was saved with.

Usage, from the repository root::

    # before the change (e.g. from a worktree of the earlier commit, first on PYTHONPATH):
    python scripts/check_behaviour.py --save tests/fixtures/behaviour_cpu.npz
    python scripts/check_behaviour.py --cudasim --save tests/fixtures/behaviour_cudasim.npz
    # after it:
    python scripts/check_behaviour.py --check tests/fixtures/behaviour_cpu.npz
    python scripts/check_behaviour.py --cudasim --check tests/fixtures/behaviour_cudasim.npz

``--check`` prints every array that differs (with its largest absolute
difference) and every missing or extra one, then a summary line; it exits
with 1 on any difference and 0 otherwise. The path of the imported nblstm
package is printed first, to show which tree was tested.
"""

import os
import sys

if __name__ == "__main__" and "--cudasim" in sys.argv[1:]:
    # The simulator is chosen when numba.cuda is first imported: before anything imports numba.
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402

import nblstm  # noqa: E402
from nblstm import convert, raw_ops, reference  # noqa: E402

METADATA_KEY = "__metadata__"
#: Exit status of ``--check --skip-other-environment`` when the environment differs (automake's "skipped").
SKIPPED = 77
F16, F32, F64 = np.float16, np.float32, np.float64

# (T, B, I, H)
TINY = (3, 2, 3, 4)
BATCH1 = (4, 1, 5, 8)
# B * H * 4H >= 2**15: the sequence kernels split the hidden units across threads; the backward's GEMMs
# after the time loop are split by rows too.
BIG = (6, 8, 40, 64)
# B * H * 4H = 2**15 and T * B * (2I + H) * 4H = 2**18: split across threads as BIG, at a fraction of its size.
MID = (4, 8, 16, 32)
# I > 256 at B < 8: the input projection is one GEMM before the time loop rather than part of each step.
WIDE = (3, 4, 260, 16)
# B * H * 4H >= 2**18: LSTMCell's kernels split the hidden units across threads.
CELL_BIG = (5, 16, 40, 64)
CELL_BIG_NARROW = (3, 16, 4, 64)
# The simulator runs every GPU thread as a Python thread: very small shapes only.
SIM_A = (3, 2, 3, 4)
SIM_B = (2, 3, 2, 5)

OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")


# ---------------------------------------------------------------------------
# Inputs and results
# ---------------------------------------------------------------------------


def rng_for(name):
    """A generator seeded from the case name (stable across runs and machines)."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def op_inputs(rng, shape, dtype):
    """Random inputs of the sequence ops: x, cs_prev, h_prev, w, b, wci, wcf, wco, cs_grad, h_grad."""
    steps, batch, inputs, units = shape
    scale = 1.5 / np.sqrt(inputs + units)
    arrays = {
        "x": rng.standard_normal((steps, batch, inputs)),
        "cs_prev": rng.standard_normal((batch, units)),
        "h_prev": 0.5 * rng.standard_normal((batch, units)),
        "w": scale * rng.standard_normal((inputs + units, 4 * units)),
        "b": 0.3 * rng.standard_normal(4 * units),
        "wci": 0.4 * rng.standard_normal(units),
        "wcf": 0.4 * rng.standard_normal(units),
        "wco": 0.4 * rng.standard_normal(units),
        "cs_grad": rng.standard_normal((steps, batch, units)),
        "h_grad": rng.standard_normal((steps, batch, units)),
    }
    return {k: a.astype(dtype) for k, a in arrays.items()}


def to_host(a):
    """A result as a NumPy array (GPU arrays are copied back)."""
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


def flatten(prefix, value, out):
    """Every array of a (nested) result into ``out``, keyed ``prefix/field``."""
    if value is None:
        out[prefix] = np.array("None")
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for field, item in zip(value._fields, value):
            flatten(f"{prefix}/{field}", item, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}/{key}", item, out)
    elif isinstance(value, (tuple, list)):
        for k, item in enumerate(value):
            flatten(f"{prefix}/{k}", item, out)
    else:
        out[prefix] = to_host(value)


class Results:
    """The results of every case: ``{"case/output": ndarray}``."""

    def __init__(self):
        self.arrays = {}

    def add(self, case, name, value):
        key = f"{case}/{name}"
        if any(k == key or k.startswith(key + "/") for k in self.arrays):
            raise RuntimeError(f"duplicate result {key}")
        flatten(key, value, self.arrays)


def peephole_args(a, use_peephole, convert_to=None):
    names = ("wci", "wcf", "wco") if use_peephole else ()
    conv = convert_to or (lambda x: x)
    return [conv(a[k]) for k in names]


# ---------------------------------------------------------------------------
# CPU cases
# ---------------------------------------------------------------------------

# name: (shape, dtype, layout, use_peephole, cell_clip, forget_bias, seq_len_max)
SEQUENCE_CASES = {
    "tiny_f32_ifco_plain": (TINY, F32, "ifco", False, None, 0.0, None),
    "tiny_f32_icfo_peep_clip_fb": (TINY, F32, "icfo", True, 0.5, 1.0, 3),
    "tiny_f32_icfo_seq0": (TINY, F32, "icfo", True, 0.5, 1.0, 0),
    "tiny_f64_ifco_peep_fb_seq2": (TINY, F64, "ifco", True, None, 0.7, 2),
    "tiny_f64_icfo_clip": (TINY, F64, "icfo", False, 0.8, 0.0, None),
    "tiny_f64_ifco_seq0": (TINY, F64, "ifco", False, None, 0.0, 0),
    "tiny_f16_ifco_peep_clip": (TINY, F16, "ifco", True, 1.0, 0.0, 3),
    "tiny_f16_icfo_fb_seq1": (TINY, F16, "icfo", False, None, 1.0, 1),
    "batch1_f32_icfo_peep_clip_seq3": (BATCH1, F32, "icfo", True, 0.6, 0.0, 3),
    "batch1_f64_ifco_plain": (BATCH1, F64, "ifco", False, None, 0.0, None),
    "batch1_f16_ifco_peep_fb": (BATCH1, F16, "ifco", True, None, 0.5, None),
    "big_f32_ifco_peep_clip": (BIG, F32, "ifco", True, 1.2, 0.0, None),
    "big_f32_icfo_fb_seq4": (BIG, F32, "icfo", False, None, 1.0, 4),
    "big_f64_icfo_peep_clip_fb_seq5": (BIG, F64, "icfo", True, 0.9, 1.0, 5),
    "mid_f64_ifco_plain": (MID, F64, "ifco", False, None, 0.0, None),
    "mid_f32_icfo_peep_seq3": (MID, F32, "icfo", True, None, 0.0, 3),
    "big_f16_ifco_peep": (BIG, F16, "ifco", True, None, 0.0, None),
    "wide_f32_icfo_peep_clip": (WIDE, F32, "icfo", True, 0.7, 1.0, None),
    "wide_f64_ifco_seq2": (WIDE, F64, "ifco", False, None, 0.0, 2),
}


def sequence_case(res, name, spec, dev=None):
    """block_lstm and block_lstm_grad (given cs_grad and h_grad) of one option set."""
    shape, dtype, layout, peep, clip, fb, seq = spec
    a = op_inputs(rng_for(name), shape, dtype)
    d = dev or (lambda x: x)
    core = [d(a[k]) for k in ("x", "cs_prev", "h_prev", "w")]
    out = nblstm.block_lstm(
        *core,
        d(a["b"]),
        *peephole_args(a, peep, d),
        seq_len_max=seq,
        forget_bias=fb,
        cell_clip=clip,
        use_peephole=peep,
        layout=layout,
    )
    res.add(name, "forward", out)
    grads = nblstm.block_lstm_grad(
        *core,
        out,
        d(a["cs_grad"]),
        d(a["h_grad"]),
        *peephole_args(a, peep, d),
        seq_len_max=seq,
        use_peephole=peep,
        layout=layout,
    )
    res.add(name, "grad", grads)


def sequence_extras(res):
    """The backward without cs_grad/h_grad, outputs given as a list and as a dict; non-finite inputs."""
    name = "seq_grad_defaults_f32"
    a = op_inputs(rng_for(name), TINY, F32)
    core = [a[k] for k in ("x", "cs_prev", "h_prev", "w")]
    out = nblstm.block_lstm(*core, a["b"])
    res.add(name, "forward", out)
    res.add(name, "grad_no_grads", nblstm.block_lstm_grad(*core, out))
    res.add(name, "grad_h_only_list", nblstm.block_lstm_grad(*core, list(out), h_grad=a["h_grad"]))
    res.add(name, "grad_cs_only_dict", nblstm.block_lstm_grad(*core, out._asdict(), cs_grad=a["cs_grad"]))

    for dtype in (F32, F64):
        name = f"nonfinite_{np.dtype(dtype).name}"
        a = op_inputs(rng_for(name), TINY, dtype)
        a["x"][1, 0, 2] = np.nan
        a["x"][0, 1, 0] = np.inf
        a["h_grad"][2, 1, 3] = -np.inf
        core = [a[k] for k in ("x", "cs_prev", "h_prev", "w")]
        peeps = peephole_args(a, True)
        out = nblstm.block_lstm(*core, a["b"], *peeps, forget_bias=1.0, cell_clip=0.5, use_peephole=True)
        res.add(name, "forward", out)
        res.add(name, "grad", nblstm.block_lstm_grad(*core, out, a["cs_grad"], a["h_grad"], *peeps, use_peephole=True))


def noncontiguous_case(res):
    """Every input a non-contiguous view (negative and step strides, Fortran order, column slices)."""
    for dtype, shape in ((F32, MID), (F64, TINY), (F16, TINY)):
        name = f"noncontig_{np.dtype(dtype).name}_{'x'.join(map(str, shape))}"
        rng = rng_for(name)
        steps, batch, inputs, units = shape
        a = op_inputs(rng, shape, dtype)
        views = {}
        for k, v in a.items():
            if k in ("x", "cs_grad", "h_grad"):
                base = rng.standard_normal((steps, 2 * batch, v.shape[2] + 1)).astype(dtype)
                view = base[::-1, ::2, 1:]
            elif k == "w":
                view = np.asfortranarray(v)
            elif k in ("cs_prev", "h_prev"):
                base = rng.standard_normal((batch, 2 * units + 1)).astype(dtype)
                view = base[:, 1::2]
            else:
                view = np.zeros(2 * v.shape[0], dtype)[::2]
            view[...] = v
            assert not view.flags.c_contiguous or v.size <= 1, k
            views[k] = view
        core = [views[k] for k in ("x", "cs_prev", "h_prev", "w")]
        peeps = peephole_args(views, True)
        out = nblstm.block_lstm(
            *core, views["b"], *peeps, forget_bias=0.5, cell_clip=1.0, use_peephole=True, layout="icfo"
        )
        res.add(name, "forward", out)
        # The forward outputs as views too.
        out_views = [np.asfortranarray(o) for o in out]
        grads = nblstm.block_lstm_grad(
            *core, out_views, views["cs_grad"], views["h_grad"], *peeps, use_peephole=True, layout="icfo"
        )
        res.add(name, "grad", grads)
        step = nblstm.lstm_block_cell(
            views["x"][1],
            views["cs_prev"],
            views["h_prev"],
            views["w"],
            views["b"],
            *peeps,
            forget_bias=1.0,
            cell_clip=0.8,
            use_peephole=True,
        )
        res.add(name, "cell", step)
        res.add(
            name,
            "cell_grad",
            nblstm.lstm_block_cell_grad(
                views["x"][1],
                views["cs_prev"],
                views["h_prev"],
                views["w"],
                step,
                views["cs_grad"][0],
                views["h_grad"][0],
                *peeps,
                use_peephole=True,
            ),
        )
        cell = nblstm.LSTMCell(units, use_peepholes=True, cell_clip=1.0, dtype=dtype, seed=5)
        state = nblstm.LSTMStateTuple(views["cs_prev"], views["h_prev"])
        lengths = (np.arange(2 * batch, dtype=np.int64) % (steps + 1))[::-2]  # a view as well
        (outputs, final), backward = cell.vjp(views["x"], state, lengths)
        res.add(name, "lstmcell_forward", {"outputs": outputs, "final": final})
        d_final = nblstm.LSTMStateTuple(views["cs_grad"][0], views["h_grad"][-1])
        res.add(name, "lstmcell_backward", backward(views["h_grad"], d_final))


def readonly_case(res):
    """Every input read-only (forward outputs included), ops and cell."""
    for dtype, shape in ((F32, MID), (F64, TINY), (F16, TINY)):
        name = f"readonly_{np.dtype(dtype).name}_{'x'.join(map(str, shape))}"
        a = op_inputs(rng_for(name), shape, dtype)
        for v in a.values():
            v.flags.writeable = False
        core = [a[k] for k in ("x", "cs_prev", "h_prev", "w")]
        peeps = peephole_args(a, True)
        out = nblstm.block_lstm(*core, a["b"], *peeps, forget_bias=1.0, cell_clip=2.0, use_peephole=True)
        res.add(name, "forward", out)
        frozen = []
        for o in out:
            o = o.copy()
            o.flags.writeable = False
            frozen.append(o)
        res.add(
            name, "grad", nblstm.block_lstm_grad(*core, frozen, a["cs_grad"], a["h_grad"], *peeps, use_peephole=True)
        )
        step = nblstm.lstm_block_cell(
            a["x"][0], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, use_peephole=True, layout="icfo"
        )
        res.add(name, "cell", step)
        res.add(
            name,
            "cell_grad",
            nblstm.lstm_block_cell_grad(
                a["x"][0],
                a["cs_prev"],
                a["h_prev"],
                a["w"],
                step,
                a["cs_grad"][0],
                a["h_grad"][0],
                *peeps,
                use_peephole=True,
                layout="icfo",
            ),
        )
        cell = nblstm.LSTMCell(
            shape[3], num_proj=max(1, shape[3] // 2), use_peepholes=True, cell_clip=1.0, dtype=dtype, seed=11
        )
        lengths = np.arange(shape[1], dtype=np.int64) % (shape[0] + 1)
        lengths.flags.writeable = False
        (outputs, final), backward = cell.vjp(a["x"], None, lengths)
        res.add(name, "lstmcell_forward", {"outputs": outputs, "final": final})
        d_out = np.ones_like(outputs)
        d_out.flags.writeable = False
        res.add(name, "lstmcell_backward", backward(d_out))


# name: (shape, dtype, layout, use_peephole, cell_clip, forget_bias)
STEP_CASES = {
    "step_tiny_f32_ifco_plain": (TINY, F32, "ifco", False, None, 0.0),
    "step_tiny_f32_icfo_peep_clip_fb": (TINY, F32, "icfo", True, 0.4, 1.0),
    "step_tiny_f64_ifco_peep": (TINY, F64, "ifco", True, None, 0.3),
    "step_tiny_f16_icfo_clip": (TINY, F16, "icfo", False, 0.5, 0.0),
    "step_batch1_f64_icfo_peep_clip": (BATCH1, F64, "icfo", True, 0.7, 1.0),
    "step_big_f32_ifco_peep_clip": (BIG, F32, "ifco", True, 1.0, 0.0),
    "step_big_f64_icfo_fb": (BIG, F64, "icfo", False, None, 1.0),
}


def step_case(res, name, spec, dev=None):
    """lstm_block_cell and lstm_block_cell_grad on step 0 of the sequence inputs."""
    shape, dtype, layout, peep, clip, fb = spec
    a = op_inputs(rng_for(name), shape, dtype)
    d = dev or (lambda x: x)
    core = [d(a["x"][0]), d(a["cs_prev"]), d(a["h_prev"]), d(a["w"])]
    step = nblstm.lstm_block_cell(
        *core, d(a["b"]), *peephole_args(a, peep, d), forget_bias=fb, cell_clip=clip, use_peephole=peep, layout=layout
    )
    res.add(name, "forward", step)
    grads = nblstm.lstm_block_cell_grad(
        *core, step, d(a["cs_grad"][0]), d(a["h_grad"][0]), *peephole_args(a, peep, d), use_peephole=peep, layout=layout
    )
    res.add(name, "grad", grads)
    if dev is None:  # six outputs (no h) and omitted gradients
        res.add(
            name,
            "grad_six_outputs_no_grads",
            nblstm.lstm_block_cell_grad(
                *core, tuple(step)[:6], None, None, *peephole_args(a, peep), use_peephole=peep, layout=layout
            ),
        )


def raw_ops_cases(res, shapes_dtypes, dev=None):
    """Every op of nblstm.raw_ops with TensorFlow's signatures (keywords), defaults and explicit options.

    In the simulator (``dev`` given) only the ops with peepholes and clipping run.
    """
    d = dev or (lambda x: x)
    for shape, dtype in shapes_dtypes:
        name = f"raw_{np.dtype(dtype).name}_{'x'.join(map(str, shape))}"
        a = op_inputs(rng_for(name), shape, dtype)
        steps = shape[0]
        args = {k: d(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")}
        grads_in = {"cs_grad": d(a["cs_grad"]), "h_grad": d(a["h_grad"])}

        if dev is None:
            v1 = raw_ops.BlockLSTM(seq_len_max=steps, **args)  # forget_bias=1.0, cell_clip=3.0
            res.add(name, "BlockLSTM_defaults", v1)
        v1p = raw_ops.BlockLSTM(seq_len_max=steps - 1, **args, forget_bias=0.5, cell_clip=0.6, use_peephole=True)
        res.add(name, "BlockLSTM_peep_clip", v1p)
        res.add(
            name,
            "BlockLSTMGrad",
            raw_ops.BlockLSTMGrad(seq_len_max=steps - 1, **args, **v1p._asdict(), **grads_in, use_peephole=True),
        )
        if dev is None:
            v2 = raw_ops.BlockLSTMV2(seq_len_max=steps, **args)  # cell_clip=0.0: off
            res.add(name, "BlockLSTMV2_defaults", v2)
            res.add(
                name,
                "BlockLSTMGradV2_no_peep",
                raw_ops.BlockLSTMGradV2(seq_len_max=steps, **args, **v2._asdict(), **grads_in, use_peephole=False),
            )
        v2p = raw_ops.BlockLSTMV2(
            steps, *(args[k] for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")), 0.9, True
        )  # positional
        res.add(name, "BlockLSTMV2_peep_clip", v2p)
        res.add(
            name,
            "BlockLSTMGradV2",
            raw_ops.BlockLSTMGradV2(seq_len_max=steps, **args, **v2p._asdict(), **grads_in, use_peephole=True),
        )
        step_args = dict(args, x=d(a["x"][0]))
        step = raw_ops.LSTMBlockCell(**step_args, use_peephole=True)
        res.add(name, "LSTMBlockCell_peep", step)
        if dev is None:
            res.add(name, "LSTMBlockCell_noclip", raw_ops.LSTMBlockCell(**step_args, forget_bias=0.0, cell_clip=-1.0))
        sg = {"cs_grad": d(a["cs_grad"][0]), "h_grad": d(a["h_grad"][0])}
        res.add(
            name,
            "LSTMBlockCellGrad",
            raw_ops.LSTMBlockCellGrad(
                **step_args, **{k: getattr(step, k) for k in OUTPUT_NAMES[:6]}, **sg, use_peephole=True
            ),
        )


def reference_cases(res):
    """The float64 NumPy reference of nblstm.reference."""
    for name, (shape, dtype, layout, peep, clip, fb, seq) in {
        "ref_tiny_f64_icfo_peep_clip_fb": (TINY, F64, "icfo", True, 0.5, 1.0, None),
        "ref_tiny_f32_ifco_seq2": (TINY, F32, "ifco", False, -1.0, 0.0, 2),
        "ref_batch1_f64_ifco_peep": (BATCH1, F64, "ifco", True, -1.0, 0.3, 3),
    }.items():
        a = op_inputs(rng_for(name), shape, dtype)
        core = [a[k] for k in ("x", "cs_prev", "h_prev", "w")]
        peeps = [a[k] for k in ("wci", "wcf", "wco")]
        out = reference.block_lstm(
            *core, a["b"], *peeps, seq_len_max=seq, forget_bias=fb, cell_clip=clip, use_peephole=peep, layout=layout
        )
        res.add(name, "forward", out)
        res.add(
            name,
            "grad",
            reference.block_lstm_grad(
                *core, *peeps, out, a["cs_grad"], a["h_grad"], seq_len_max=seq, use_peephole=peep, layout=layout
            ),
        )


def convert_cases(res):
    """Every function of nblstm.convert on fixed arrays."""
    rng = rng_for("convert")
    inputs, units, proj = 3, 2, 1
    w = rng.standard_normal((inputs + units, 4 * units))
    b = rng.standard_normal(4 * units)
    peeps = [rng.standard_normal(units) for _ in range(3)]
    c = "convert"
    res.add(c, "icfo_to_ifco", convert.icfo_to_ifco(w))
    res.add(c, "icfo_to_ifco_axis0", convert.icfo_to_ifco(w.T, axis=0))
    res.add(c, "ifco_to_icfo", convert.ifco_to_icfo(b))
    res.add(c, "block_lstm_v1_to_v2", convert.block_lstm_v1_to_v2(w, b, forget_bias=0.7))
    res.add(c, "block_lstm_v2_to_v1", convert.block_lstm_v2_to_v1(w, b, forget_bias=1.0))
    cell_weights = {"kernel": w, "bias": b, "w_f_diag": peeps[1], "w_i_diag": peeps[0], "w_o_diag": peeps[2]}
    res.add(c, "lstmcell_to_block_lstm", convert.lstmcell_to_block_lstm(cell_weights, forget_bias=1.0, cell_clip=0.5))
    res.add(c, "block_lstm_to_lstmcell", convert.block_lstm_to_lstmcell(w, b, *peeps))
    kernel, recurrent = w[:inputs], w[inputs:]
    res.add(c, "keras_to_block_lstm_v2", convert.keras_to_block_lstm_v2(kernel, recurrent, b))
    res.add(c, "block_lstm_v2_to_keras", convert.block_lstm_v2_to_keras(w, b, input_size=inputs))
    torch_sd = convert.block_lstm_v2_to_torch(w, b, input_size=inputs)
    res.add(c, "block_lstm_v2_to_torch", torch_sd)
    res.add(c, "torch_to_block_lstm_v2", convert.torch_to_block_lstm_v2(torch_sd))
    proj_weights = {
        "kernel": rng.standard_normal((inputs + proj, 4 * units)),
        "bias": b,
        "projection/kernel": rng.standard_normal((units, proj)),
    }
    torch_proj = convert.lstmcell_to_torch(proj_weights, forget_bias=1.0)
    res.add(c, "lstmcell_to_torch_proj", torch_proj)
    res.add(c, "torch_to_lstmcell_proj", convert.torch_to_lstmcell(torch_proj, forget_bias=1.0))
    plain = {"kernel": w, "bias": b}
    res.add(c, "lstmcell_to_keras", convert.lstmcell_to_keras(plain, forget_bias=1.0))
    res.add(c, "keras_to_lstmcell", convert.keras_to_lstmcell([kernel, recurrent, b], forget_bias=0.5))
    cudnn = convert.block_lstm_v2_to_cudnn(w, b, input_size=inputs)
    res.add(c, "block_lstm_v2_to_cudnn", cudnn)
    res.add(c, "cudnn_to_block_lstm_v2", convert.cudnn_to_block_lstm_v2(*cudnn))
    res.add(c, "float32_icfo_to_ifco", convert.icfo_to_ifco(w.astype(F32)))


# name: (cell kwargs, dtype, (T, B, I), lengths, random initial state)
CELL_CASES = {
    "cell_tiny_f32_default": (dict(num_units=4), F32, TINY[:3], None, False),
    "cell_tiny_f64_proj_peep_clips_joined": (
        dict(num_units=4, num_proj=3, use_peepholes=True, cell_clip=0.5, proj_clip=0.3, state_is_tuple=False),
        F64,
        (4, 3, 3),
        [4, 0, 2],
        True,
    ),
    "cell_tiny_f32_clip0_relu": (
        dict(num_units=4, cell_clip=0.0, activation="relu", forget_bias=0.0, initializer="he_normal"),
        F32,
        TINY[:3],
        [3, 1],
        True,
    ),
    "cell_tiny_f16_sigmoid_fb_peep": (
        dict(num_units=4, activation="sigmoid", forget_bias=0.3, use_peepholes=True),
        F16,
        TINY[:3],
        [2, 3],
        True,
    ),
    "cell_tiny_f64_linear_proj": (
        dict(num_units=4, num_proj=2, activation="linear", proj_clip=0.5),
        F64,
        TINY[:3],
        [0, 3],
        True,
    ),
    "cell_batch1_f32_proj_peep": (
        dict(num_units=8, num_proj=5, use_peepholes=True, cell_clip=1.0),
        F32,
        BATCH1[:3],
        [3],
        True,
    ),
    "cell_batch1_f16_joined": (dict(num_units=8, state_is_tuple=False, cell_clip=0.8), F16, BATCH1[:3], None, True),
    "cell_big_f32_proj_peep_clip": (
        dict(num_units=64, num_proj=32, use_peepholes=True, cell_clip=1.0, proj_clip=0.4),
        F32,
        CELL_BIG[:3],
        [5, 4, 3, 2, 1, 0, 5, 5, 2, 3, 4, 5, 1, 5, 0, 5],
        True,
    ),
    "cell_big_f64_narrow_tanh": (dict(num_units=64, cell_clip=2.0), F64, CELL_BIG_NARROW[:3], [3, 2, 1, 0] * 4, True),
    "cell_b8_f32_peep_lengths": (
        dict(num_units=16, use_peepholes=True, forget_bias=0.5),
        F32,
        (6, 8, 5),
        [6, 1, 0, 6, 3, 6, 2, 5],
        True,
    ),
}
# The other activations, on the smallest cell.
CELL_CASES.update(
    {
        f"cell_tiny_f64_{act}": (dict(num_units=3, activation=act, cell_clip=1.5), F64, (2, 2, 3), [2, 1], True)
        for act in ("elu", "softsign", "softplus", "selu")
    }
)


def random_state(cell, rng, batch, dtype):
    """A random host state (or state gradient) of the cell's structure."""
    zero = cell.zero_state(batch, dtype)
    if isinstance(zero, tuple):
        return nblstm.LSTMStateTuple(*((0.5 * rng.standard_normal(z.shape)).astype(dtype) for z in zero))
    return (0.5 * rng.standard_normal(zero.shape)).astype(dtype)


def cell_case(res, name, spec, dev=None, lengths_kind="array"):
    """LSTMCell: zero_state, get_weights, one step, run, vjp and its backward with every gradient combination."""
    kwargs, dtype, (steps, batch, inputs), lengths, init = spec
    rng = rng_for(name)
    d = dev or (lambda x: x)
    cell = nblstm.LSTMCell(dtype=dtype, seed=zlib.crc32(name.encode()) % 1000, **kwargs)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    res.add(name, "zero_state", cell.zero_state(batch, dtype))
    state = random_state(cell, rng, batch, dtype) if init else None
    if lengths is not None:
        lengths = {"array": np.array(lengths, np.int64), "int32": np.array(lengths, np.int32), "list": list(lengths)}[
            lengths_kind
        ]

    def dstate(s):
        if s is None or dev is None:
            return s
        return type(s)(*(d(p) for p in s)) if isinstance(s, tuple) else d(s)

    step_state = state if state is not None else cell.zero_state(batch, dtype)
    res.add(name, "call", cell(d(x[0]), dstate(step_state)))
    small = cell.num_units <= 16  # the big cases keep fewer results (the size of the snapshot)
    if small:
        res.add(name, "weights", cell.get_weights())
    if small and dev is None:  # the simulator is slow: vjp's forward is run's
        res.add(name, "run", cell.run(d(x), dstate(state), lengths))
    (outputs, final), backward = cell.vjp(d(x), dstate(state), lengths)
    res.add(name, "vjp_forward", {"outputs": outputs, "final": final})
    d_out = rng.standard_normal((steps, batch, cell.output_size)).astype(dtype)
    d_final = random_state(cell, rng, batch, dtype)
    res.add(name, "backward_both", backward(d(d_out), dstate(d_final)))
    if dev is None and small:
        res.add(name, "backward_outputs", backward(d_out))
        res.add(name, "backward_final", backward(None, d_final))
        if isinstance(d_final, tuple):
            res.add(name, "backward_final_h_only", backward(d_out, nblstm.LSTMStateTuple(None, d_final.h)))


def cpu_cases(res):
    for name, spec in SEQUENCE_CASES.items():
        sequence_case(res, name, spec)
    sequence_extras(res)
    for name, spec in STEP_CASES.items():
        step_case(res, name, spec)
    noncontiguous_case(res)
    readonly_case(res)
    raw_ops_cases(res, [(TINY, F32), (TINY, F64), (BATCH1, F16), (MID, F32)])
    reference_cases(res)
    convert_cases(res)
    for k, (name, spec) in enumerate(CELL_CASES.items()):
        cell_case(res, name, spec, lengths_kind=("array", "int32", "list")[k % 3])


# ---------------------------------------------------------------------------
# Simulator cases
# ---------------------------------------------------------------------------


def cudasim_cases(res):
    from numba import cuda

    def dev(a):
        return None if a is None else cuda.to_device(np.ascontiguousarray(a))

    for name, spec in {
        "sim_a_f32_ifco_plain": (SIM_A, F32, "ifco", False, None, 0.0, None),
        "sim_a_f64_icfo_peep_clip_fb_seq2": (SIM_A, F64, "icfo", True, 0.5, 1.0, 2),
        "sim_b_f32_icfo_peep_fb": (SIM_B, F32, "icfo", True, None, 1.0, None),
        "sim_b_f16_ifco_peep_clip": (SIM_B, F16, "ifco", True, 0.6, 0.0, None),
        "sim_b_f64_ifco_seq0": (SIM_B, F64, "ifco", False, None, 0.0, 0),
    }.items():
        sequence_case(res, name, spec, dev=dev)
    for name, spec in {
        "sim_step_a_f32_icfo_peep_clip_fb": (SIM_A, F32, "icfo", True, 0.4, 1.0),
        "sim_step_b_f64_ifco": (SIM_B, F64, "ifco", False, None, 0.0),
    }.items():
        step_case(res, name, spec, dev=dev)
    raw_ops_cases(res, [(SIM_B, F32)], dev=dev)
    for name, spec in {
        "sim_cell_f32_proj_peep_clips": (
            dict(num_units=3, num_proj=2, use_peepholes=True, cell_clip=0.4, proj_clip=0.15),
            F32,
            (3, 3, 2),
            [3, 0, 2],
            True,
        ),
        "sim_cell_f64_joined_relu_fb": (
            dict(num_units=3, state_is_tuple=False, activation="relu", forget_bias=0.5, cell_clip=0.0),
            F64,
            (2, 2, 3),
            [2, 1],
            True,
        ),
    }.items():
        cell_case(res, name, spec, dev=dev)


# ---------------------------------------------------------------------------
# Metadata, save and check
# ---------------------------------------------------------------------------


def metadata(cudasim):
    import llvmlite
    import llvmlite.binding as llvm
    import numba
    import scipy

    meta = {
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "cpu_name": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
        "numba_threads": numba.get_num_threads(),
        "cudasim": bool(cudasim),
    }
    if cudasim:
        from importlib.metadata import PackageNotFoundError, version

        try:
            meta["numba_cuda"] = version("numba-cuda")
        except PackageNotFoundError:
            meta["numba_cuda"] = None
    return meta


def compute(cudasim):
    res = Results()
    if cudasim:
        cudasim_cases(res)
    else:
        cpu_cases(res)
    return res.arrays


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def describe_difference(got, want):
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != saved {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != saved {want.shape}"
    if got.size == 0:
        return "empty arrays with different bytes"
    differing = int(
        np.count_nonzero((_bytes(got).reshape(got.size, -1) != _bytes(want).reshape(got.size, -1)).any(axis=1))
    )
    text = f"{differing} of {got.size} elements differ"
    if got.dtype.kind == "f":
        g, w = got.astype(np.float64), want.astype(np.float64)
        nan_diff = int(np.count_nonzero(np.isnan(g) != np.isnan(w)))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(g - w)
        finite = diff[np.isfinite(diff)]
        text += f", max abs difference {float(finite.max()) if finite.size else 0.0:.3e}"
        if nan_diff:
            text += f", NaN at {nan_diff} elements in one only"
    return text


def load_snapshot(path):
    """``(arrays, metadata)`` of a saved snapshot (metadata ``None`` when it has none)."""
    with np.load(path, allow_pickle=False) as data:
        saved = {k: data[k] for k in data.files}
    saved_meta = json.loads(str(saved.pop(METADATA_KEY))) if METADATA_KEY in saved else None
    return saved, saved_meta


def use_saved_thread_count(saved_meta):
    """Run on the snapshot's number of numba threads when this process can.

    The forward results do not depend on the thread count; those of the
    backward passes of large problems can (their GEMMs after the time loop
    are split in one block per thread, and LSTMCell's backward splits its
    recurrent products too), so the check runs on the count the snapshot
    was saved with.
    """
    import numba

    wanted = (saved_meta or {}).get("numba_threads")
    if wanted is None:
        return
    if wanted <= numba.config.NUMBA_NUM_THREADS:
        numba.set_num_threads(wanted)
        print(f"numba threads: {wanted}, as in the snapshot")
    else:
        print(
            f"warning: the snapshot was saved on {wanted} numba threads; this process can use at most "
            f"{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS): large backward results may differ"
        )


#: What bitwise results depend on, of the metadata saved with a snapshot.
ENVIRONMENT_KEYS = ("numba", "llvmlite", "numpy", "scipy", "cpu_name", "cpu_features", "numba_cuda")


def environment_differences(saved_meta):
    """How this environment differs from the one that saved the snapshot: a list of sentences (empty if none)."""
    import numba

    if saved_meta is None:
        return ["the snapshot has no metadata"]
    here = metadata(saved_meta.get("cudasim", False))
    differences = [f"{key}: {here.get(key)!r} here, {saved_meta.get(key)!r} saved"
                   for key in ENVIRONMENT_KEYS if saved_meta.get(key) != here.get(key)]
    wanted = saved_meta.get("numba_threads", 1)
    if not saved_meta.get("cudasim") and wanted > numba.config.NUMBA_NUM_THREADS:
        differences.append(f"numba threads: at most {numba.config.NUMBA_NUM_THREADS} here, {wanted} saved")
    return differences


def compare(arrays, saved, saved_meta):
    for difference in environment_differences(saved_meta):
        print(f"warning: {difference} (bitwise results may differ for that reason alone)")
    mismatches = 0
    missing = sorted(set(saved) - set(arrays))
    extra = sorted(set(arrays) - set(saved))
    for key in missing:
        print(f"MISSING  {key}: saved, not computed")
    for key in extra:
        print(f"EXTRA    {key}: computed, not in the snapshot")
    for key in sorted(set(saved) & set(arrays)):
        got, want = arrays[key], saved[key]
        same = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(_bytes(got), _bytes(want))
        if not same:
            mismatches += 1
            print(f"MISMATCH {key}: {describe_difference(got, want)}")
    compared = len(set(saved) & set(arrays))
    ok = not (mismatches or missing or extra)
    print(
        f"{'OK' if ok else 'FAILED'}: {compared} arrays compared bitwise, {mismatches} differ, "
        f"{len(missing)} missing, {len(extra)} extra"
    )
    return ok


def save(arrays, path, cudasim):
    meta = metadata(cudasim)
    if METADATA_KEY in arrays:
        raise RuntimeError(f"a result is named {METADATA_KEY}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(path, **arrays, **{METADATA_KEY: np.array(json.dumps(meta, sort_keys=True))})
    total = sum(a.nbytes for a in arrays.values())
    print(
        f"saved {len(arrays)} arrays ({total / 1e6:.2f} MB uncompressed, {os.path.getsize(path) / 1e6:.2f} MB "
        f"on disk) to {path}"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="PATH.npz", help="compute every case and save the results")
    mode.add_argument("--check", metavar="PATH.npz", help="compute every case and compare it bitwise with PATH")
    parser.add_argument(
        "--cudasim",
        action="store_true",
        help="run the GPU path in Numba's CUDA simulator (set before numba is imported)",
    )
    parser.add_argument(
        "--skip-other-environment",
        action="store_true",
        help=f"with --check: exit with {SKIPPED} (nothing computed) when the environment differs from the snapshot's",
    )
    args = parser.parse_args(argv)
    if args.cudasim and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        parser.error("--cudasim must be given on the command line (the simulator is chosen at import)")
    print(f"nblstm imported from {os.path.dirname(os.path.realpath(nblstm.__file__))}")
    if args.check:
        saved, saved_meta = load_snapshot(args.check)
        if saved_meta is not None and bool(saved_meta.get("cudasim")) != args.cudasim:
            parser.error(f"{args.check} was saved {'with' if saved_meta.get('cudasim') else 'without'} --cudasim")
        differences = environment_differences(saved_meta)
        if args.skip_other_environment and differences:
            print("skipped: the snapshot was saved in another environment (" + "; ".join(differences) + ")")
            return SKIPPED
        if not args.cudasim:  # the simulator runs no numba parallel regions
            use_saved_thread_count(saved_meta)
    start = time.perf_counter()
    arrays = compute(args.cudasim)
    print(f"computed {len(arrays)} arrays in {time.perf_counter() - start:.1f} s")
    if args.save:
        save(arrays, args.save, args.cudasim)
        return 0
    return 0 if compare(arrays, saved, saved_meta) else 1


if __name__ == "__main__":
    sys.exit(main())
