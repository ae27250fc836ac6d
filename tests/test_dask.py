"""nblstm.dask: the fused ops, their gradient and a layer's training step on batch-chunked Dask arrays.

On a local multi-process cluster, the threaded and the synchronous
schedulers, against one call on the whole batch. Skipped when dask or
distributed is not installed (``pip install "nblstm[dask]"``).
"""

import copy
import logging
import pickle

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import nblstm  # noqa: E402
import nblstm.dask as nbd  # noqa: E402
from tests.test_properties import GRAD_NAMES, OUTPUT_NAMES, make_arrays  # noqa: E402

TOL = {np.float64: 1e-13, np.float32: 2e-6, np.float16: 1e-3}


@pytest.fixture(scope="module")
def client():
    """Two worker processes with one thread each (spawned, so no fork after OpenMP)."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       silence_logs=logging.ERROR)
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def assert_outputs_match(got, expected, dtype, what):
    rtol = TOL[np.dtype(dtype).type]
    for name, g, e in zip(OUTPUT_NAMES, got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{what}: {name}"
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=rtol,
                                   err_msg=f"{what}: {name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [
    {},
    {"seq_len_max": 3, "forget_bias": 1.0, "cell_clip": 0.5, "use_peephole": True, "layout": "icfo"},
])
def test_block_lstm_on_a_cluster_equals_one_call(client, dtype, options):
    a = make_arrays(1, 5, 10, 3, 4, dtype, 1.0)
    peeps = (a["wci"], a["wcf"], a["wco"]) if options.get("use_peephole") else ()
    expected = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
    x = da.from_array(a["x"], chunks=(2, (3, 3, 4), 3))  # chunked along time too: brought to one chunk
    cs_prev = da.from_array(a["cs_prev"], chunks=(5, 4))  # other batch chunks than x: follows x's
    out = nbd.block_lstm(x, cs_prev, a["h_prev"], a["w"], a["b"], *peeps, **options)
    assert all(o.chunks == ((5,), (3, 3, 4), (4,)) for o in out)
    got = client.compute(list(out), sync=True)
    assert_outputs_match(got, expected, dtype, "distributed")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lstm_block_cell_on_a_cluster_equals_one_call(client, dtype):
    a = make_arrays(2, 1, 9, 3, 4, dtype, 1.0)
    peeps = (a["wci"], a["wcf"], a["wco"])
    options = {"forget_bias": 1.0, "cell_clip": 3.0, "use_peephole": True, "layout": "icfo"}
    expected = nblstm.lstm_block_cell(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
    x = da.from_array(a["x"][0], chunks=(4, 3))
    out = nbd.lstm_block_cell(x, da.from_array(a["cs_prev"]), a["h_prev"], a["w"], a["b"], *peeps, **options)
    assert isinstance(out, nblstm.LSTMBlockCellOutput)
    assert all(o.chunks == ((4, 4, 1), (4,)) for o in out)
    got = client.compute(list(out), sync=True)
    assert_outputs_match(got, expected, dtype, "distributed")


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_local_schedulers(scheduler):
    a = make_arrays(3, 4, 7, 2, 3, np.float32, 1.0)
    expected = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], cell_clip=1.0)
    x = da.from_array(a["x"], chunks=(4, 2, 2))
    out = nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"], a["b"], cell_clip=1.0)
    got = dask.compute(*out, scheduler=scheduler)
    assert_outputs_match(got, expected, np.float32, scheduler)


def test_outputs_share_one_task_per_chunk(monkeypatch):
    a = make_arrays(4, 3, 6, 2, 3, np.float64, 1.0)
    calls = []
    real = nblstm.ops.block_lstm

    def counting(*args, **kwargs):
        calls.append((kwargs["x"] if "x" in kwargs else args[0]).shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(nblstm.ops, "block_lstm", counting)
    out = nbd.block_lstm(da.from_array(a["x"], chunks=(3, 2, 2)), a["cs_prev"], a["h_prev"], a["w"], a["b"])
    calls.clear()  # the argument check ran it once on an empty batch
    dask.compute(*out, scheduler="sync")
    assert sorted(calls) == [(3, 2, 2)] * 3, "one call per batch chunk, shared by the seven outputs"


def test_empty_batch_and_numpy_inputs():
    a = make_arrays(5, 3, 0, 2, 3, np.float32, 1.0)
    out = nbd.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    got = dask.compute(*out, scheduler="sync")
    assert all(g.shape == (3, 0, 3) and g.dtype == np.float32 for g in got)


def test_wrong_arguments_raise_when_the_graph_is_built():
    a = make_arrays(6, 3, 4, 2, 3, np.float64, 1.0)
    x = da.from_array(a["x"], chunks=(3, 2, 2))
    core = (a["cs_prev"], a["h_prev"], a["w"], a["b"])
    with pytest.raises(ValueError, match="batch size"):
        nbd.block_lstm(x, a["cs_prev"][:3], a["h_prev"], a["w"], a["b"])
    with pytest.raises(ValueError, match="shape"):
        nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"][1:], a["b"])
    with pytest.raises(ValueError, match="rank"):
        nbd.block_lstm(x[0], *core)
    with pytest.raises(TypeError, match="dtype"):
        nbd.block_lstm(x.astype(np.float32), *core)
    with pytest.raises(TypeError, match="Dask or NumPy"):
        nbd.block_lstm(a["x"].tolist(), *core)
    with pytest.raises(ValueError, match="seq_len_max"):
        nbd.block_lstm(x, *core, seq_len_max=4)
    with pytest.raises(ValueError, match="peephole"):
        nbd.block_lstm(x, *core, use_peephole=True)
    with pytest.raises(ValueError, match="rank"):
        nbd.lstm_block_cell(x, *core)
    unknown = x[x[:, 0, 0] > -100]  # boolean indexing: unknown chunk sizes
    with pytest.raises(ValueError, match="unknown"):
        nbd.block_lstm(unknown, *core)


# -- block_lstm_grad -----------------------------------------------------------------------------------

#: Float32 rounding: sums over chunks are added in another order than one call's.
GRAD_TOL = {np.float64: 1e-12, np.float32: 1e-5}


def assert_grads_match(got, expected, dtype, what):
    rtol = GRAD_TOL[np.dtype(dtype).type]
    for name, g, e in zip(GRAD_NAMES, got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{what}: {name}"
        scale = max(float(np.abs(e).max(initial=0.0)), 1.0)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: {name}")


def grad_problem(seed, dtype, options, batch=10):
    """Arrays and the whole-batch forward outputs and gradients for ``options`` (forward and backward ones)."""
    a = make_arrays(seed, 5, batch, 3, 4, dtype, 1.0)
    peeps = (a["wci"], a["wcf"], a["wco"]) if options.get("use_peephole") else ()
    back = {k: options[k] for k in ("seq_len_max", "use_peephole", "layout") if k in options}
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
    expected = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"],
                                      *peeps, **back)
    return a, peeps, back, expected


GRAD_OPTIONS = [
    {},
    {"seq_len_max": 3, "forget_bias": 1.0, "cell_clip": 0.5, "use_peephole": True, "layout": "icfo"},
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", GRAD_OPTIONS)
def test_block_lstm_grad_on_a_cluster_equals_one_call(client, dtype, options):
    a, peeps, back, expected = grad_problem(7, dtype, options)
    x = da.from_array(a["x"], chunks=(2, (3, 3, 4), 3))
    out = nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
    h_grad = da.from_array(a["h_grad"], chunks=(5, 5, 4))  # other batch chunks than x: follows x's
    grads = nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], h_grad, *peeps, **back)
    assert isinstance(grads, nblstm.BlockLSTMGradOutput)
    assert grads.x_grad.chunks == ((5,), (3, 3, 4), (3,))
    assert grads.cs_prev_grad.chunks == grads.h_prev_grad.chunks == ((3, 3, 4), (4,))
    assert grads.w_grad.chunks == ((7,), (16,)) and grads.b_grad.chunks == ((16,),)
    got = client.compute(list(grads), sync=True)
    assert_grads_match(got, expected, dtype, "distributed")
    # The same graph on the threaded and the synchronous schedulers: the same sums, bit for bit.
    for scheduler in ("threads", "sync"):
        again = dask.compute(*grads, scheduler=scheduler)
        for name, g, e in zip(GRAD_NAMES, again, got, strict=True):
            np.testing.assert_array_equal(g, e, err_msg=f"{scheduler}: {name}")


@pytest.mark.parametrize(("batch_chunks", "split_every"), [
    ((10,), None), ((4, 4, 2), None), ((1,) * 10, 2), ((3, 1, 4, 2), 3), ((2,) * 5, 8),
])
def test_block_lstm_grad_chunkings_on_threads(batch_chunks, split_every):
    a, _, back, expected = grad_problem(8, np.float32, {"cell_clip": 1.0})
    x = da.from_array(a["x"], chunks=(5, batch_chunks, 3))
    out = nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"], a["b"], cell_clip=1.0)
    grads = nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"],
                                split_every=split_every)
    assert grads.x_grad.chunks[1] == batch_chunks
    assert_grads_match(dask.compute(*grads, scheduler="threads"), expected, np.float32, str(batch_chunks))


def test_block_lstm_grad_numpy_outputs_and_no_incoming_gradients():
    a, _, _, _ = grad_problem(9, np.float64, {})
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    expected = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out)
    x = da.from_array(a["x"], chunks=(5, 4, 3))
    grads = nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"], out._asdict())  # a dict of NumPy arrays
    assert_grads_match(dask.compute(*grads, scheduler="sync"), expected, np.float64, "numpy outputs")


def test_block_lstm_grad_tree_and_one_task_per_chunk(monkeypatch):
    a, _, _, expected = grad_problem(10, np.float64, {}, batch=10)
    x = da.from_array(a["x"], chunks=(5, 1, 3))
    out = nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"], a["b"])
    calls = []
    real = nblstm.ops.block_lstm_grad

    def counting(*args, **kwargs):
        calls.append((kwargs["x"] if "x" in kwargs else args[0]).shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(nblstm.ops, "block_lstm_grad", counting)
    grads = nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"], split_every=3)
    sums = [k for k in dict(grads.w_grad.__dask_graph__()) if str(k).startswith("_sum_in_order")]
    assert len(sums) == 4 + 2 + 1, "10 chunks summed by threes: 4, then 2, then 1 task"
    calls.clear()  # the argument check ran it once on an empty batch
    got = dask.compute(*grads, scheduler="sync")
    assert sorted(calls) == [(5, 1, 3)] * 10, "one call per batch chunk, shared by the eight gradients"
    assert_grads_match(got, expected, np.float64, "split_every=3")


def test_block_lstm_grad_float16_and_empty_batch():
    a, _, _, expected = grad_problem(11, np.float16, {}, batch=6)
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    x = da.from_array(a["x"], chunks=(5, 2, 3))
    got = dask.compute(*nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"], out, h_grad=a["h_grad"]),
                       scheduler="sync")
    whole = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, h_grad=a["h_grad"])
    for name, g, e in zip(GRAD_NAMES, got, whole, strict=True):
        assert g.dtype == np.float16, name
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-2, atol=1e-2, err_msg=name)
    e = make_arrays(12, 3, 0, 2, 3, np.float32, 1.0)
    out = nblstm.block_lstm(e["x"], e["cs_prev"], e["h_prev"], e["w"], e["b"])
    got = dask.compute(*nbd.block_lstm_grad(e["x"], e["cs_prev"], e["h_prev"], e["w"], out), scheduler="sync")
    assert got[0].shape == (3, 0, 2) and got[3].shape == (5, 12) and not got[3].any()


def test_block_lstm_grad_wrong_arguments_raise_when_the_graph_is_built():
    a, _, _, _ = grad_problem(13, np.float64, {}, batch=4)
    x = da.from_array(a["x"], chunks=(5, 2, 3))
    out = nbd.block_lstm(x, a["cs_prev"], a["h_prev"], a["w"], a["b"])
    core = (a["cs_prev"], a["h_prev"], a["w"], out)
    with pytest.raises(ValueError, match="h_grad: 3"):
        nbd.block_lstm_grad(x, *core, h_grad=a["h_grad"][:, :3])
    with pytest.raises(ValueError, match="outputs.h: 3"):
        nbd.block_lstm_grad(x, *core[:3], out._replace(h=out.h[:, :3]))
    with pytest.raises(ValueError, match="h_grad has shape"):
        nbd.block_lstm_grad(x, *core, h_grad=a["h_grad"][:4])
    with pytest.raises(ValueError, match="w has shape"):
        nbd.block_lstm_grad(x, a["cs_prev"], a["h_prev"], a["w"][1:], out)
    with pytest.raises(TypeError, match="dtype"):
        nbd.block_lstm_grad(x, *core, cs_grad=a["cs_grad"].astype(np.float32))
    with pytest.raises(ValueError, match="peephole"):
        nbd.block_lstm_grad(x, *core, use_peephole=True)
    with pytest.raises(ValueError, match="seq_len_max"):
        nbd.block_lstm_grad(x, *core, seq_len_max=6)
    with pytest.raises(ValueError, match="layout"):
        nbd.block_lstm_grad(x, *core, layout="iofc")
    with pytest.raises(TypeError, match="outputs"):
        nbd.block_lstm_grad(x, *core[:3], out.h)
    with pytest.raises(ValueError, match="outputs must hold the 7"):
        nbd.block_lstm_grad(x, *core[:3], tuple(out)[:6])
    with pytest.raises(ValueError, match="outputs.cs must have rank 3"):
        nbd.block_lstm_grad(x, *core[:3], out._replace(cs=out.cs[0]))
    with pytest.raises(TypeError, match="cs_prev must be a Dask or NumPy"):
        nbd.block_lstm_grad(x, a["cs_prev"].tolist(), *core[1:])
    with pytest.raises(ValueError, match="split_every must be >= 2"):
        nbd.block_lstm_grad(x, *core, split_every=1)
    with pytest.raises(TypeError, match="split_every"):
        nbd.block_lstm_grad(x, *core, split_every=2.0)
    unknown = x[x[:, 0, 0] > -100]
    with pytest.raises(ValueError, match="unknown"):
        nbd.block_lstm_grad(unknown, *core)


# -- a layer's loss and weight gradients ---------------------------------------------------------------

def squared_error(batch):
    """``loss_fn``: half the squared error against ``target``, a mean over the whole batch (a local
    function: pickled by value for the workers)."""
    def loss_fn(output, target):
        diff = output - target
        return 0.5 * float((diff.astype(np.float64) ** 2).sum()) / batch, diff / output.dtype.type(batch)
    return loss_fn


def last_step_error(batch_first):
    """``loss_fn``: the squared error of each example's last output against a ``[B, D * P]`` target."""
    def loss_fn(output, target):
        last = output[:, -1] if batch_first else output[-1]
        d_output = np.zeros_like(output)
        diff = last - target
        if batch_first:
            d_output[:, -1] = diff
        else:
            d_output[-1] = diff
        return 0.5 * float((diff.astype(np.float64) ** 2).sum()), d_output
    return loss_fn


def one_call(lstm, loss_fn, x, target, **kwargs):
    """The loss and weight gradients of one call on the whole batch."""
    (output, _), backward = lstm.vjp(x, **kwargs)
    loss, d_output = loss_fn(output, target)
    return loss, backward(d_output)[2]


def assert_layer_grads_match(got, expected, what, rtol=1e-5):
    loss, grads = got
    loss_e, grads_e = expected
    assert sorted(grads) == sorted(grads_e), what
    np.testing.assert_allclose(loss, loss_e, rtol=rtol, err_msg=f"{what}: loss")
    for name, e in grads_e.items():
        assert grads[name].dtype == e.dtype and grads[name].shape == e.shape, f"{what}: {name}"
        scale = max(float(np.abs(e).max()), 1e-3)
        np.testing.assert_allclose(grads[name], e, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: {name}")


LAYERS = {
    "stacked-bidirectional-proj": {"num_layers": 2, "bidirectional": True, "proj_size": 3, "use_peepholes": True,
                                   "cell_clip": 2.0},
    "batch_first": {"batch_first": True, "forget_bias": 1.0},
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_loss_and_grads_on_a_cluster_equals_one_vjp(client, kind):
    config = LAYERS[kind]
    lstm = nblstm.LSTM(3, 4, seed=1, **config)
    rng = np.random.default_rng(2)
    T, B = 5, 9
    shape = (B, T) if lstm.batch_first else (T, B)
    x_np = rng.standard_normal((*shape, 3), dtype=np.float32)
    y_np = rng.standard_normal((*shape, lstm.output_size), dtype=np.float32)
    lengths = rng.integers(0, T + 1, B)
    loss_fn = squared_error(B)
    expected = one_call(lstm, loss_fn, x_np, y_np, sequence_length=lengths)
    batch_axis = 0 if lstm.batch_first else 1
    chunks = [-1, -1, -1]
    chunks[batch_axis] = (4, 1, 4)
    x = da.from_array(x_np, chunks=tuple(chunks))
    y = da.from_array(y_np, chunks=3)  # rechunked along the batch like x, one chunk elsewhere
    loss, grads = nbd.loss_and_grads(lstm, loss_fn, x, y, sequence_length=da.from_array(lengths, chunks=2))
    assert loss.shape == () and loss.dtype == np.float64
    assert set(grads) == set(lstm.weight_names) and all(g.numblocks == (1,) * g.ndim for g in grads.values())
    got = client.compute([loss, grads], sync=True)
    assert_layer_grads_match(got, expected, kind)
    again = dask.compute(loss, grads, scheduler="threads")
    assert again[0] == got[0] and all(np.array_equal(again[1][n], got[1][n]) for n in grads), "schedulers agree"


@pytest.mark.parametrize("batch_chunks", [(6,), (2, 2, 2), (1, 5), (1,) * 6])
def test_loss_and_grads_chunkings_masks_and_labels(batch_chunks):
    lstm = nblstm.LSTM(2, 3, num_layers=2, bidirectional=True, seed=3)
    rng = np.random.default_rng(4)
    T, B = 4, 6
    x_np = rng.standard_normal((T, B, 2), dtype=np.float32)
    mask = rng.random((B, T)) > 0.3
    labels = rng.standard_normal((B, lstm.output_size), dtype=np.float32)  # one target per example: [B, D * P]
    loss_fn = last_step_error(False)
    expected = one_call(lstm, loss_fn, x_np, labels, mask=mask)
    x = da.from_array(x_np, chunks=(T, batch_chunks, 2))
    got = nbd.loss_and_grads(lstm, loss_fn, x, da.from_array(labels, chunks=(2, 3)), mask=mask, target_axis=0,
                             split_every=2)
    assert_layer_grads_match(dask.compute(*got, scheduler="threads"), expected, str(batch_chunks))


def test_loss_and_grads_one_dimensional_targets_and_lists():
    lstm = nblstm.LSTM(2, 3, batch_first=True, dtype=np.float64, seed=5)
    rng = np.random.default_rng(6)
    x_np = rng.standard_normal((5, 4, 2))  # [B, T, I]
    labels = rng.standard_normal(5)  # [B]: the first unit of the last output

    def loss_fn(output, target):
        d_output = np.zeros_like(output)
        diff = output[:, -1, 0] - target
        d_output[:, -1, 0] = diff
        return 0.5 * float((diff ** 2).sum()), d_output

    lengths = [4, 1, 0, 3, 4]
    expected = one_call(lstm, loss_fn, x_np, labels, sequence_length=lengths)
    got = nbd.loss_and_grads(lstm, loss_fn, da.from_array(x_np, chunks=(2, 4, 2)), labels, sequence_length=lengths)
    assert_layer_grads_match(dask.compute(*got, scheduler="sync"), expected, "1-D target", rtol=1e-12)


def test_the_layer_travels_once_as_a_copy_without_caches():
    lstm = nblstm.LSTM(2, 3, num_layers=2, seed=7)
    x = np.ones((3, 8, 2), np.float32)
    lstm(x)  # fills the cells' caches of packed weights
    assert lstm.cells[0]._target_cache
    restored = pickle.loads(pickle.dumps(lstm))
    assert not restored.cells[0]._target_cache and lstm.cells[0]._target_cache, "a copy drops them, not the source"
    assert np.array_equal(restored(x)[0], lstm(x)[0])
    assert not copy.deepcopy(lstm).cells[1]._target_cache

    loss_fn = squared_error(8)
    before = one_call(lstm, loss_fn, x, np.zeros((3, 8, 3), np.float32))
    loss, grads = nbd.loss_and_grads(lstm, loss_fn, da.from_array(x, chunks=(3, 2, 2)), np.zeros((3, 8, 3),
                                                                                                  np.float32))
    graph = dict(loss.__dask_graph__())
    assert len([k for k in graph if str(k).startswith("nblstm-lstm-")]) == 1, "one copy of the layer for 4 chunks"
    nbd.sgd_step(lstm, {k: np.ones_like(w) for k, w in lstm.get_weights().items()}, lr=0.1)  # changed afterwards
    assert_layer_grads_match(dask.compute(loss, grads, scheduler="sync"), before, "snapshot", rtol=1e-6)


def test_dropout_draws_each_chunks_masks():
    rng = np.random.default_rng(8)
    half = rng.standard_normal((4, 3, 2))
    x = da.from_array(np.concatenate([half, half], axis=1), chunks=(4, 3, 2))  # two equal chunks
    y = np.zeros((4, 6, 3))

    def layer():
        return nblstm.LSTM(2, 3, num_layers=2, dropout=0.5, dtype=np.float64, seed=9)

    def loss(lstm, inputs, target, training=True):
        return float(dask.compute(nbd.loss_and_grads(lstm, squared_error(6), inputs, target,
                                                     training=training)[0], scheduler="sync")[0])

    lstm = layer()
    first, second = loss(lstm, x, y), loss(lstm, x, y)
    assert first == loss(layer(), x, y), "the same seed, the same masks"
    assert len({first, second, loss(lstm, x, y, training=False)}) == 3, "each step draws new masks"
    one_chunk = loss(layer(), x[:, :3], y[:, :3])  # chunk 0 of the first call, its masks
    assert one_chunk != first - one_chunk, "the chunks draw their own masks"
    np.testing.assert_allclose(first - one_chunk, first / 2, rtol=0.5)  # the same scale


def test_a_few_sgd_steps_reduce_the_loss():
    lstm = nblstm.LSTM(2, 4, seed=10)
    rng = np.random.default_rng(11)
    x = da.from_array(rng.standard_normal((6, 16, 2), dtype=np.float32), chunks=(6, 5, 2))
    y = da.from_array(np.tanh(x.compute().sum(axis=2, keepdims=True).repeat(4, axis=2) * 0.5), chunks=(6, 5, 4))
    losses = []
    for _ in range(8):
        loss, grads = dask.compute(*nbd.loss_and_grads(lstm, squared_error(16), x, y), scheduler="threads")
        losses.append(float(loss))
        nbd.sgd_step(lstm, grads, lr=1.0)
    assert losses[-1] < 0.8 * losses[0] and all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    loss, grads = nbd.loss_and_grads(lstm, squared_error(16), x, y)
    weights = lstm.get_weights()
    nbd.sgd_step(lstm, grads, lr=0.5)  # Dask gradients: computed there
    g = dask.compute(grads, scheduler="sync")[0]
    for name, w in lstm.get_weights().items():
        np.testing.assert_allclose(w, weights[name] - np.float32(0.5) * g[name], rtol=1e-6, atol=1e-7)


def test_loss_and_grads_wrong_arguments():
    lstm = nblstm.LSTM(2, 3, seed=12)
    x = da.ones((4, 6, 2), dtype=np.float32, chunks=(4, 3, 2))
    loss_fn = squared_error(6)
    y = np.zeros((4, 6, 3), np.float32)
    with pytest.raises(TypeError, match="lstm must be an nblstm.LSTM"):
        nbd.loss_and_grads(lstm.cells[0], loss_fn, x, y)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        nbd.loss_and_grads(lstm, None, x, y)
    with pytest.raises(TypeError, match="input has dtype"):
        nbd.loss_and_grads(lstm, loss_fn, x.astype(np.float64), y)
    with pytest.raises(ValueError, match="input_size"):
        nbd.loss_and_grads(lstm, loss_fn, x[..., :1], y)
    with pytest.raises(ValueError, match="input must have rank 3"):
        nbd.loss_and_grads(lstm, loss_fn, x[0], y)
    with pytest.raises(ValueError, match="target: 5"):
        nbd.loss_and_grads(lstm, loss_fn, x, y[:, :5])
    with pytest.raises(ValueError, match="target_axis=3"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, target_axis=3)
    with pytest.raises(ValueError, match="target_axis is given"):
        nbd.loss_and_grads(lstm, loss_fn, x, target_axis=0)
    with pytest.raises(ValueError, match="sequence_length: 5"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, sequence_length=np.ones(5, int))
    with pytest.raises(TypeError, match="sequence_length must have an integer dtype"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, sequence_length=np.ones(6))
    with pytest.raises(ValueError, match="sequence_length values"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, sequence_length=[5] * 6)
    with pytest.raises(ValueError, match="mask"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, mask=np.ones((6, 3), bool))
    with pytest.raises(ValueError, match="not both"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, sequence_length=[4] * 6, mask=np.ones((6, 4), bool))
    with pytest.raises(TypeError, match="training"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, training=1)
    with pytest.raises(ValueError, match="split_every"):
        nbd.loss_and_grads(lstm, loss_fn, x, y, split_every=0)
    # What loss_fn returns is checked when the graph is computed.
    bad = nbd.loss_and_grads(lstm, lambda output, target: 1.0, x, y)
    with pytest.raises(TypeError, match="loss_fn must return a pair"):
        dask.compute(*bad, scheduler="sync")
    bad = nbd.loss_and_grads(lstm, lambda output, target: (np.zeros(2), output), x, y)
    with pytest.raises(ValueError, match="scalar loss"):
        dask.compute(*bad, scheduler="sync")
    bad = nbd.loss_and_grads(lstm, lambda output, target: (0.0, output.astype(np.float64)), x, y)
    with pytest.raises(ValueError, match="d_output of shape"):
        dask.compute(*bad, scheduler="sync")


def test_sgd_step_wrong_arguments_leave_the_weights():
    lstm = nblstm.LSTM(2, 3, seed=13)
    weights = lstm.get_weights()
    ones = {k: np.ones_like(w) for k, w in weights.items()}
    with pytest.raises(TypeError, match="lstm must be"):
        nbd.sgd_step(None, ones, 0.1)
    with pytest.raises(TypeError, match="grads must be a dict"):
        nbd.sgd_step(lstm, list(ones.values()), 0.1)
    with pytest.raises(ValueError, match=r"missing \['l0/bias'\]"):
        nbd.sgd_step(lstm, {"l0/kernel": ones["l0/kernel"]}, 0.1)
    with pytest.raises(ValueError, match="grads\\['l0/bias'\\] has shape"):
        nbd.sgd_step(lstm, {**ones, "l0/bias": np.ones(3)}, 0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        nbd.sgd_step(lstm, ones, 0.0)
    with pytest.raises(TypeError, match="lr must be a real number"):
        nbd.sgd_step(lstm, ones, "0.1")
    assert all(np.array_equal(w, weights[k]) for k, w in lstm.get_weights().items())
