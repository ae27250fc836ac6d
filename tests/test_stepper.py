"""Tests of LSTMCell.stepper: streaming one step at a time, bitwise equal to the cell's own steps.

Shapes are tiny (the kernels compile once per dtype: float32 and float64;
float16 computes in float32). The reference is the cell itself: the
stepper promises the bits of ``cell(x_t, state)`` chained step by step.
"""

import threading

import numba
import numpy as np
import pytest
from numba.core import event

import nblstm
from nblstm import LSTMCell, LSTMStateTuple
from nblstm.cell import ACTIVATION_NAMES
from nblstm.cell.stepper import Stepper
from nblstm.cpu import step as cpu_step

T, I, H, P = 5, 3, 4, 2

# Every option, alone and together.
OPTIONS = [
    {},
    {"use_peepholes": True},
    {"cell_clip": 0.4, "forget_bias": 0.3},
    {"cell_clip": 0.0},
    {"num_proj": P},
    {"num_proj": P, "proj_clip": 0.15},
    {
        "num_proj": 3,
        "proj_clip": 0.2,
        "use_peepholes": True,
        "cell_clip": 0.5,
        "activation": "relu",
        "forget_bias": -0.5,
    },
] + [{"activation": a, "use_peepholes": True} for a in ACTIVATION_NAMES[1:]]


def make_cell(dtype=np.float32, input_depth=I, units=H, seed=0, **options):
    """A built cell with random weights, bias and peepholes included (every term is exercised)."""
    rng = np.random.default_rng(seed)
    cell = LSTMCell(units, dtype=dtype, seed=seed, **options)
    cell.build(input_depth)
    weights = cell.get_weights()
    for name, a in weights.items():
        weights[name] = (rng.standard_normal(a.shape) * (0.5 if a.ndim == 1 else 1.0)).astype(dtype)
    cell.set_weights(weights)
    return cell


def random_state(cell, batch, dtype, seed=1):
    rng = np.random.default_rng(seed)
    return LSTMStateTuple(
        rng.standard_normal((batch, cell.num_units)).astype(dtype),
        (0.5 * rng.standard_normal((batch, cell.output_size))).astype(dtype),
    )


def inputs(batch, dtype, steps=T, depth=I, seed=2):
    return (2 * np.random.default_rng(seed).standard_normal((steps, batch, depth))).astype(dtype)


def assert_same(actual, expected, what=""):
    """Bitwise equality (NaN included), with the dtype and shape."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8), err_msg=what)


# ----------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 3])
def test_bitwise_equal_to_the_cells_steps(options, dtype, batch):
    cell = make_cell(dtype, **options)
    x = inputs(batch, dtype)
    state = random_state(cell, batch, dtype)
    step = cell.stepper(batch_size=batch, initial_state=state)
    for t in range(T):
        output, state = cell(x[t], state)
        assert_same(step(x[t]), output, f"output of step {t}")
        assert_same(step.state.c, state.c, f"c after step {t}")
        assert_same(step.state.h, state.h, f"h after step {t}")
    # cell.run one step at a time: the same bits.
    once, final = cell.run(x[-1:], step.state)
    assert_same(step(x[-1]), once[0])
    assert_same(step.state.c, final.c)


@pytest.mark.parametrize("batch", [1, 2])
def test_float16_computes_in_float32_and_keeps_a_float16_state(batch):
    cell = make_cell(np.float16, num_proj=P, use_peepholes=True, cell_clip=1.0)
    x = inputs(batch, np.float16)
    state = random_state(cell, batch, np.float16)
    step = cell.stepper(batch, state)
    for t in range(T):
        output, state = cell(x[t], state)
        assert_same(step(x[t]), output, f"output of step {t}")
        assert_same(step.state.c, state.c, f"c after step {t}")


def test_close_to_a_whole_sequence_run():
    # cell.run computes the input projection of all steps in one GEMM, whose
    # rounding may differ from a step's in the last bit (a matrix-vector
    # product at B = 1): equal to rounding, not bitwise.
    for batch in (1, 3):
        cell = make_cell(np.float64, num_proj=P, use_peepholes=True)
        x = inputs(batch, np.float64, steps=20)
        outputs, final = cell.run(x)
        step = cell.stepper(batch)
        streamed = np.stack([step(x_t) for x_t in x])
        np.testing.assert_allclose(streamed, outputs, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(step.state.c, final.c, rtol=1e-12, atol=1e-13)


def test_large_products_hold_blas_and_follow_the_cells_blocks():
    # Products of BLAS_THREAD_WORK multiply-adds run in single_threaded_blas; the
    # cell splits such input projections into row blocks by thread (a one-row block
    # is a matrix-vector product, rounded otherwise), and with more units than a
    # thread's share its projection into column chunks: the stepper follows both,
    # also when the thread count changes after it was made.
    depth = cpu_step.BLAS_THREAD_WORK // (2 * 4 * 8)
    cell = make_cell(np.float32, input_depth=depth, units=8, num_proj=P)
    step = cell.stepper(2)
    assert step._impl.holds_blas and not cell.stepper(1)._impl.holds_blas
    wide = make_cell(np.float32, input_depth=5, units=256, num_proj=100, proj_clip=0.5)
    wide_step = wide.stepper(2)
    for threads in sorted({1, numba.get_num_threads()}, reverse=True):
        with_threads = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            for c, s, depth_ in ((cell, step, depth), (wide, wide_step, 5)):
                x = inputs(2, np.float32, steps=3, depth=depth_)
                state = s.state
                for x_t in x:
                    output, state = c(x_t, state)
                    assert_same(s(x_t), output, f"{threads} threads")
        finally:
            numba.set_num_threads(with_threads)


def test_joined_state():
    cell = make_cell(np.float64, state_is_tuple=False, num_proj=P, use_peepholes=True)
    x = inputs(2, np.float64)
    state = np.concatenate(random_state(cell, 2, np.float64), axis=1)
    step = cell.stepper(2, state)
    assert_same(step.state, state)
    for x_t in x:
        output, state = cell(x_t, state)
        assert_same(step(x_t), output)
        assert_same(step.state, state)
    step.reset(np.zeros((2, H + P)))
    assert not step.state.any()


def test_reset_and_initial_state():
    cell = make_cell(np.float32, num_proj=P)
    x = inputs(2, np.float32)
    state = random_state(cell, 2, np.float32)
    fresh = cell.stepper(2)
    assert not fresh.state.c.any() and not fresh.state.h.any()
    first = [fresh(x_t) for x_t in x]
    fresh.reset()
    again = [fresh(x_t) for x_t in x]
    for a, b in zip(first, again, strict=True):
        assert_same(a, b)
    fresh.reset(state)
    from_state = cell.stepper(2, initial_state=state)
    assert_same(fresh.state.c, state.c)
    for x_t in x:
        assert_same(fresh(x_t), from_state(x_t))
    fresh.reset(list(state))  # any pair
    assert_same(fresh.state.h, state.h)


def test_outputs_are_new_arrays_or_out():
    cell = make_cell(np.float32)
    x = inputs(1, np.float32)
    step = cell.stepper()
    first = step(x[0])
    kept = first.copy()
    second = step(x[1])
    assert first is not second and not np.shares_memory(first, second)
    assert_same(first, kept)  # a later step does not touch an earlier result
    # The state is a copy too.
    state = step.state
    state.c[...] = 7
    assert not (step.state.c == 7).any()
    # out=: written and returned.
    buffer = np.full((T, 1, H), np.nan, np.float32)
    step.reset()
    results = [step(x_t, out=buffer[t]) for t, x_t in enumerate(x)]
    assert all(r is buffer[t] or np.shares_memory(r, buffer[t]) for t, r in enumerate(results))
    step.reset()
    np.testing.assert_array_equal(buffer, np.stack([step(x_t) for x_t in x]))


def test_callers_arrays_are_not_modified_and_any_layout_gives_the_same_bits():
    cell = make_cell(np.float64, num_proj=P, use_peepholes=True)
    weights = cell.get_weights()
    x = inputs(2, np.float64)
    state = random_state(cell, 2, np.float64)
    x_copy, state_copy = x.copy(), tuple(a.copy() for a in state)
    step = cell.stepper(2, state)
    expected = [step(x_t) for x_t in x]
    np.testing.assert_array_equal(x, x_copy)
    for a, b in zip(state, state_copy, strict=True):
        np.testing.assert_array_equal(a, b)
    for name, a in cell.get_weights().items():
        np.testing.assert_array_equal(a, weights[name])
    # Fortran order, a strided view, a read-only array: the same results, the inputs untouched.
    layouts = [np.asfortranarray(x[t]) for t in range(T)]
    wide = np.zeros((T, 2, 2 * I))
    wide[:, :, ::2] = x
    strided = [wide[t, :, ::2] for t in range(T)]
    frozen = x.copy()
    frozen.flags.writeable = False
    for variant in (layouts, strided, list(frozen)):
        step.reset(state)
        for t, x_t in enumerate(variant):
            assert_same(step(x_t), expected[t])
    np.testing.assert_array_equal(frozen, x)


def test_snapshot_of_the_weights():
    cell = make_cell(np.float32)
    x = inputs(1, np.float32)
    step = cell.stepper()
    before = step(x[0])
    weights = cell.get_weights()
    weights["kernel"] = weights["kernel"] * 2
    cell.set_weights(weights)
    step.reset()
    assert_same(step(x[0]), before)  # the stepper keeps the weights it was made with
    output, _ = cell(x[0], cell.zero_state(1, np.float32))
    assert_same(cell.stepper()(x[0]), output)  # a new one takes the new weights
    assert not np.array_equal(output, before)


def test_nonfinite_inputs_propagate():
    cell = make_cell(np.float32)
    step = cell.stepper()
    x = np.array([[np.nan, 0.0, np.inf]], np.float32)
    output, _ = cell(x, cell.zero_state(1, np.float32))
    assert_same(step(x), output)
    assert np.isnan(step.state.c).all()


def test_attributes_and_repr():
    cell = make_cell(np.float64, num_proj=P)
    step = cell.stepper(batch_size=3)
    assert isinstance(step, Stepper)
    assert (step.batch_size, step.input_depth, step.num_units, step.output_size) == (3, I, H, P)
    assert step.dtype == np.float64
    assert repr(step) == "Stepper(batch_size=3, input_depth=3, num_units=4, output_size=2, dtype=float64)"
    assert cell.stepper(batch_size=2.0).batch_size == 2  # an integral float, as zero_state takes


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


class FakeGpuArray:
    """Looks like a GPU array to the validation (``__cuda_array_interface__``)."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 3}


def test_cell_without_weights():
    with pytest.raises(ValueError, match="build"):
        LSTMCell(4).stepper()


def test_batch_size_errors():
    cell = make_cell()
    with pytest.raises(ValueError, match="batch_size"):
        cell.stepper(batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        cell.stepper(batch_size=-1)
    with pytest.raises(TypeError, match="batch_size"):
        cell.stepper(batch_size=True)
    with pytest.raises(TypeError, match="batch_size"):
        cell.stepper(batch_size="1")


def test_input_errors_name_x_t():
    cell = make_cell(np.float32)
    step = cell.stepper(batch_size=2)
    with pytest.raises(ValueError, match=r"x_t has shape \(2, 4\); expected \(2, 3\)"):
        step(np.zeros((2, I + 1), np.float32))
    with pytest.raises(ValueError, match="x_t has shape"):
        step(np.zeros((1, I), np.float32))  # the stepper's batch size is 2
    with pytest.raises(ValueError, match="x_t has shape"):
        step(np.zeros(I, np.float32))
    with pytest.raises(ValueError, match="x_t has shape"):
        step(np.zeros((1, 2, I), np.float32))
    with pytest.raises(TypeError, match="x_t has dtype float64; expected float32"):
        step(np.zeros((2, I)))
    with pytest.raises(TypeError, match="x_t has dtype int64"):
        step(np.zeros((2, I), np.int64))
    with pytest.raises(TypeError, match="x_t must be a NumPy array"):
        step([[0.0] * I] * 2)
    with pytest.raises(TypeError, match="x_t is a GPU array"):
        step(FakeGpuArray((2, I)))
    # A failed call leaves the state as it was.
    assert not step.state.c.any()


def test_out_errors():
    cell = make_cell(np.float32)
    step = cell.stepper()
    x = np.zeros((1, I), np.float32)
    with pytest.raises(ValueError, match="out has shape"):
        step(x, out=np.zeros((1, H + 1), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        step(x, out=np.zeros((1, H)))
    with pytest.raises(TypeError, match="out must be a NumPy array"):
        step(x, out=[0.0] * H)
    frozen = np.zeros((1, H), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        step(x, out=frozen)


def test_state_errors():
    cell = make_cell(np.float32, num_proj=P)
    good = cell.zero_state(2, np.float32)
    with pytest.raises(ValueError, match=r"initial_state.c"):
        cell.stepper(2, LSTMStateTuple(np.zeros((2, H + 1), np.float32), good.h))
    with pytest.raises(ValueError, match=r"initial_state.h"):
        cell.stepper(2, LSTMStateTuple(good.c, np.zeros((1, P), np.float32)))
    with pytest.raises(TypeError, match=r"initial_state.c has dtype float64"):
        cell.stepper(2, LSTMStateTuple(good.c.astype(np.float64), good.h))
    with pytest.raises(TypeError, match="initial_state must be an LSTMStateTuple"):
        cell.stepper(2, np.zeros((2, H + P), np.float32))
    with pytest.raises(TypeError, match="GPU"):
        cell.stepper(2, LSTMStateTuple(FakeGpuArray((2, H)), good.h))
    step = cell.stepper(2)
    with pytest.raises(ValueError, match=r"state.c"):
        step.reset(LSTMStateTuple(np.zeros((3, H), np.float32), np.zeros((3, P), np.float32)))
    joined = make_cell(np.float32, state_is_tuple=False)
    with pytest.raises(TypeError, match=r"one \[B, 8\] array"):
        joined.stepper(1, (np.zeros((1, H), np.float32), np.zeros((1, H), np.float32)))


# ----------------------------------------------------------------------------------------------------
# Threads
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"num_proj": P, "use_peepholes": True}], ids=["plain", "proj"])
def test_one_stepper_from_several_threads_gives_serial_steps(options):
    # One stream fed from 4 threads at once: every output must be that of a serial step from the state the
    # previous step (of whichever thread) left. The kernel releases the GIL and works in the stepper's one
    # buffer; without the stepper's lock, thousands of 6,000 such outputs matched no serial step.
    threads, per_thread, batch = 4, 1500, 2
    cell = make_cell(np.float32, **options)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((threads, per_thread, batch, I)).astype(np.float32)
    step = cell.stepper(batch)
    barrier = threading.Barrier(threads)
    outputs = np.empty((threads, per_thread, batch, cell.output_size), np.float32)

    def feed(k):
        barrier.wait()
        for n in range(per_thread):
            outputs[k, n] = step(xs[k, n])

    pool = [threading.Thread(target=feed, args=(k,)) for k in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    # Replay: from the initial state, exactly one thread's next input gives the next output seen (the inputs
    # are random: two threads cannot both match). Ties are not expected; a miss means a mixed step.
    replay = cell.stepper(batch)
    taken = [0] * threads
    for _ in range(threads * per_thread):
        state = replay.state
        matches = []
        for k in range(threads):
            if taken[k] < per_thread:
                replay.reset(state)
                if np.array_equal(replay(xs[k, taken[k]]), outputs[k, taken[k]]):
                    matches.append(k)
        assert len(matches) == 1, f"after {sum(taken)} serial steps, {len(matches)} threads' next outputs match"
        replay.reset(state)
        replay(xs[matches[0], taken[matches[0]]])
        taken[matches[0]] += 1
    c, h = step.state
    assert_same(h, replay.state.h)
    assert_same(c, replay.state.c)


# ----------------------------------------------------------------------------------------------------
# Compilation
# ----------------------------------------------------------------------------------------------------


def test_warm_calls_compile_nothing():
    x = inputs(2, np.float32)
    cell = make_cell(np.float32, num_proj=P, use_peepholes=True)
    step = cell.stepper(2)
    step(x[0])  # compiled (or loaded from numba's cache) here, once per dtype
    signatures = len(cpu_step.step_kernel.signatures)
    with event.install_recorder("numba:compile") as recorder:
        for x_t in x:
            step(x_t)
        frozen = x[1].copy()
        frozen.flags.writeable = False
        step(frozen)
        step(np.asfortranarray(x[1]))
        step(x[1], out=np.empty((2, P), np.float32))
        # Other options, sizes and batch sizes are run-time values of the same kernel.
        other = make_cell(np.float32, input_depth=5, units=6, cell_clip=0.5, activation="elu")
        other_step = other.stepper(3)
        other_step(np.ones((3, 5), np.float32))
        other_step.reset()
        other_step.state  # noqa: B018 (a property)
    assert recorder.buffer == []
    assert len(cpu_step.step_kernel.signatures) == signatures
    assert numba.config.DISABLE_JIT or signatures >= 1


def test_public_name():
    assert nblstm.cell.stepper.Stepper is Stepper
