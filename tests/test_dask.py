"""nblstm.dask: the fused ops on batch-chunked Dask arrays, on a local multi-process cluster.

Skipped when dask or distributed is not installed (``pip install "nblstm[dask]"``).
"""

import logging

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import nblstm  # noqa: E402
import nblstm.dask as nbd  # noqa: E402
from tests.test_properties import OUTPUT_NAMES, make_arrays  # noqa: E402

TOL = {np.float64: 1e-13, np.float32: 2e-6, np.float16: 1e-3}


@pytest.fixture(scope="module")
def client():
    """Three worker processes with one thread each (spawned, so no fork after OpenMP)."""
    cluster = distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None,
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
