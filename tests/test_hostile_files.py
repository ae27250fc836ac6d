"""Every reader of files takes hostile ones: a ValueError or TypeError that names the file, nothing run.

The readers of files are ``nblstm.LSTM.from_onnx`` (``nblstm.porting.onnx.read``) and
``nblstm.LSTMCell.load``. Each is fed, as files of its own extension: an empty file, its own format
truncated, random bytes, other formats (the other reader's file, a NumPy array, text, a pickle whose
loading would create a file). The readers that take objects, not files (``from_torch``,
``from_keras``), refuse a path with a ``TypeError`` without opening it.
"""

import io
import os
import pathlib
import pickle

import numpy as np
import pytest

import nblstm

ROOT = pathlib.Path(__file__).resolve().parent.parent


class _Trap:
    """Unpickling it creates the file ``marker``: the readers must never unpickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _cell_file(folder):
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, seed=0)
    cell.build(4)
    cell.save(folder / "cell.npz")
    return (folder / "cell.npz").read_bytes()


def _onnx_file():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((1, 8, 3)), "R": rng.standard_normal((1, 8, 2)),
               "B": rng.standard_normal((1, 16))}
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=2, name="lstm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 1, 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a.astype(np.float32), k) for k, a in weights.items()])
    return onnx, helper.make_model(graph).SerializeToString()


def _hostile(own, other, marker):
    """``{label: bytes}``: what a reader of ``own`` files must refuse."""
    rng = np.random.default_rng(1)
    npy = io.BytesIO()
    np.save(npy, np.arange(6.0))
    evil_npz = io.BytesIO()
    np.savez(evil_npz, config=np.array([_Trap(marker)], dtype=object), **{"weight:kernel": np.zeros((5, 8))})
    return {
        "empty": b"",
        "truncated to half": own[:len(own) // 2],
        "truncated by 3 bytes": own[:-3],
        "one byte": own[:1],
        "random bytes": rng.bytes(777),
        "another format: the other reader's file": other,
        "another format: a NumPy array": npy.getvalue(),
        "another format: text": b"W = [[1, 2], [3, 4]]\n",
        "another format: a pickle": pickle.dumps(_Trap(marker)),
        "another format: an .npz with an object array": evil_npz.getvalue(),
    }


def _name(label):
    return "".join(c if c.isalnum() else "_" for c in label)


def _refuses(reader, path, marker):
    with pytest.raises((ValueError, TypeError)) as refused:
        reader(path)
    assert os.fspath(path) in str(refused.value), str(refused.value)
    assert not pathlib.Path(marker).exists(), "a file's contents were run"
    return str(refused.value)


def test_lstmcell_load_refuses_hostile_files(tmp_path):
    onnx_bytes = _onnx_file()[1] if _has_onnx() else b"\x08\x08\x3a\x04\x12\x02\x67\x67"  # a ModelProto's bytes
    own = _cell_file(tmp_path)
    marker = tmp_path / "unpickled"
    for label, data in _hostile(own, onnx_bytes, marker).items():
        path = tmp_path / f"{_name(label)}.npz"
        path.write_bytes(data)
        message = _refuses(nblstm.LSTMCell.load, path, marker)
        assert "unsafely" not in message, message  # numpy's advice for what it takes for a pickle is not passed on
        _refuses(nblstm.LSTMCell.load, str(path), marker)
    # Damaged entries of a real file: a flipped byte in each third.
    for k in range(1, 4):
        damaged = bytearray(own)
        damaged[k * len(own) // 4] ^= 0xFF
        path = tmp_path / f"damaged{k}.npz"
        path.write_bytes(bytes(damaged))
        try:
            nblstm.LSTMCell.load(path)  # a byte of a zip header's date may change nothing
        except (ValueError, TypeError) as e:
            assert str(path) in str(e)
    # Wrong contents in a well-formed file name the file too.
    for config, weights in (("[1, 2]", {}), ('{"num_units": 3, "evil": 1}', {}), ("{not json", {}),
                            ('{"num_units": 3}', {"weight:kernel": np.zeros((3, 3))}), ("[" * 100000, {})):
        path = tmp_path / "contents.npz"
        np.savez(path, config=np.array(config), **weights)
        _refuses(nblstm.LSTMCell.load, path, marker)
    with pytest.raises(FileNotFoundError):
        nblstm.LSTMCell.load(tmp_path / "missing.npz")


def _has_onnx():
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.filterwarnings("ignore:The onnxtxt format is experimental")
@pytest.mark.parametrize("extension", [".onnx", ".bin", ".json", ".textproto", ".onnxtxt"])
def test_onnx_reader_refuses_hostile_files(tmp_path, extension):
    """onnx picks the parser by the extension (protobuf, JSON, text): each refuses with the file named."""
    _, own = _onnx_file()
    marker = tmp_path / "unpickled"
    for label, data in _hostile(own, _cell_file(tmp_path), marker).items():
        path = tmp_path / f"{_name(label)}{extension}"
        path.write_bytes(data)
        _refuses(nblstm.LSTM.from_onnx, path, marker)
        _refuses(nblstm.porting.onnx.read, str(path), marker)
    # The file's own bytes are read as a model.
    good = tmp_path / "good.onnx"
    good.write_bytes(own)
    assert nblstm.LSTM.from_onnx(good).hidden_size == 2
    with pytest.raises(FileNotFoundError):
        nblstm.LSTM.from_onnx(tmp_path / "missing.onnx")


def test_onnx_reader_messages(tmp_path):
    _, own = _onnx_file()
    empty, truncated = tmp_path / "empty.onnx", tmp_path / "truncated.onnx"
    empty.write_bytes(b"")
    truncated.write_bytes(own[:-3])
    with pytest.raises(ValueError, match=r"^'.*empty.onnx' is not an ONNX model: the file is empty$"):
        nblstm.LSTM.from_onnx(empty)
    with pytest.raises(ValueError, match=r"^'.*truncated.onnx' is not an ONNX model onnx can read \(truncated, "
                                         r"corrupt or another format\): DecodeError"):
        nblstm.LSTM.from_onnx(truncated)


def test_lstmcell_load_messages(tmp_path):
    cases = {"empty.npz": (b"", "the file is empty"),
             "random.npz": (np.random.default_rng(0).bytes(100), "it is not a zip archive, which an .npz is")}
    npy = io.BytesIO()
    np.save(npy, np.zeros(3))
    cases["array.npz"] = (npy.getvalue(), r"it holds one array \(a .npy file\)")
    for name, (data, reason) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"^'.*{name}' is not an LSTMCell file \(an .npz written by "
                                             rf"LSTMCell.save\): {reason}$"):
            nblstm.LSTMCell.load(tmp_path / name)


@pytest.mark.parametrize("reader", [nblstm.LSTM.from_torch, nblstm.LSTM.from_keras, nblstm.LSTM.stack_from_keras,
                                    nblstm.LSTMCell.from_torch, nblstm.LSTMCell.from_keras])
def test_object_readers_refuse_paths_without_opening_them(tmp_path, reader):
    missing = tmp_path / "missing.pt"  # a file that does not exist: opening it would raise FileNotFoundError
    for path in (missing, str(missing)):
        with pytest.raises(TypeError):
            reader(path)


def test_no_reader_enables_pickles():
    """numpy's allow_pickle, pickle and torch.load run code from a file: no reader of nblstm uses them."""
    for source in (ROOT / "nblstm").rglob("*.py"):
        text = source.read_text()
        for needle in ("allow_pickle=True", "pickle.load", "torch.load("):
            assert needle not in text, f"{source.relative_to(ROOT)} has {needle}"
