"""Inference through nblstm against the framework a model comes from: PyTorch or Keras, on the CPU.

A user with a trained 2-layer LSTM runs it through nblstm (the layer made
from the model, or ``nblstm.torch.LSTM`` in place of ``torch.nn.LSTM``) or
through the framework itself, with the same weights, float32, no gradient:

============ ===================================================================================
framework    what is timed
============ ===================================================================================
``torch``    ``torch.nn.LSTM(I, H, num_layers=2, batch_first=True)`` under ``torch.no_grad()``;
             ``nblstm.LSTM.from_torch(module)(x)`` on the NumPy array; ``nblstm.torch.LSTM``
             with the module's ``state_dict``, under ``torch.no_grad()``
``keras``    ``model.predict_on_batch(x)`` of ``Sequential([LSTM(H, return_sequences=True)] * 2)``;
             ``nblstm.LSTM.from_keras(model)(x)`` (one 2-layer layer)
============ ===================================================================================

Both run in this one process, with the threads each uses by default; blocks
of calls of each alternate (which goes first alternates too), each block at
least ``--seconds`` long after a warm-up call. The table reports the median
block time of each and the median of the per-round ratios (below 1: nblstm
is faster). The outputs are checked against the framework's first.
Needs the framework (PyTorch, or Keras with a backend: TensorFlow by default)::

    python asv_bench/inference_compare.py torch --markdown docs/inference-benchmark-torch.md
    python asv_bench/inference_compare.py keras --markdown docs/inference-benchmark-keras.md
"""

import argparse
import datetime
import os
import platform

import numpy as np
from torch_module_compare import block_median, emit  # this folder: the same timed blocks and output

#: (T, B, I, H): the sequence length, the batches, the sizes.
SHAPES = ((30, 1, 256, 256), (30, 64, 256, 256), (30, 1000, 256, 256))


def torch_calls(steps, batch, inputs, units):
    """``{name: call}`` of the PyTorch comparison, the framework's first, and its output."""
    import torch

    import nblstm
    import nblstm.torch

    torch.manual_seed(0)
    module = torch.nn.LSTM(inputs, units, num_layers=2, batch_first=True).eval()
    layer = nblstm.LSTM.from_torch(module)
    drop_in = nblstm.torch.LSTM(inputs, units, num_layers=2, batch_first=True).eval()
    drop_in.load_state_dict(module.state_dict())
    x = torch.randn(batch, steps, inputs)
    x_np = x.numpy()

    def framework():
        with torch.no_grad():
            return module(x)[0]

    def drop_in_call():
        with torch.no_grad():
            return drop_in(x)[0]

    expected = framework().numpy()
    calls = {"torch.nn.LSTM": framework, "nblstm.LSTM.from_torch": lambda: layer(x_np)[0],
             "nblstm.torch.LSTM": drop_in_call}
    for name, call in list(calls.items())[1:]:
        got = call()
        got = got.numpy() if hasattr(got, "numpy") else got
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)
    return calls


def keras_calls(steps, batch, inputs, units):
    """``{name: call}`` of the Keras comparison, the framework's first."""
    import keras

    import nblstm

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((steps, inputs)), keras.layers.LSTM(units, return_sequences=True),
                              keras.layers.LSTM(units, return_sequences=True)])
    layer = nblstm.LSTM.from_keras(model)  # the stack of two equal layers as one 2-layer layer
    x = np.random.default_rng(0).standard_normal((batch, steps, inputs)).astype(np.float32)
    expected = np.asarray(model.predict_on_batch(x))
    got = layer(x)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    return {"Keras predict_on_batch": lambda: model.predict_on_batch(x),
            "nblstm.LSTM.from_keras": lambda: layer(x)[0]}


def measure(calls, rounds, seconds):
    names = list(calls)
    framework = names[0]
    for call in calls.values():
        call()
    blocks = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            blocks[name].append(block_median(calls[name], seconds))
    medians = {name: float(np.median(v)) for name, v in blocks.items()}
    ratios = {name: float(np.median(np.array(blocks[name]) / np.array(blocks[framework]))) for name in names[1:]}
    return medians, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=("torch", "keras"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=0.4)
    parser.add_argument("--markdown", help="write the table to this file")
    args = parser.parse_args(argv)
    import numba

    make = torch_calls if args.framework == "torch" else keras_calls
    rows = []
    for shape in SHAPES:
        medians, ratios = measure(make(*shape), args.rounds, args.seconds)
        rows.append((shape, medians, ratios))
        print(shape, {k: round(v * 1e3, 3) for k, v in medians.items()}, ratios, flush=True)
    if args.framework == "torch":
        import torch

        versions = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
    else:
        import keras

        versions = f"Keras {keras.__version__}, backend {keras.backend.backend()}"
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            versions += f" (TensorFlow {tf.__version__})"
    names = list(rows[0][1])
    lines = [
        f"Generated by `asv_bench/inference_compare.py {args.framework}` on {datetime.date.today()}: "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {versions}; numba "
        f"{numba.__version__} ({numba.get_num_threads()} threads), NumPy {np.__version__}. A 2-layer LSTM, "
        f"batch-first `x [B, T, I]` float32, no gradient; {args.rounds} rounds of alternating blocks of at "
        f"least {args.seconds} s. Times: median block medians; ratios: median of the rounds' ratios to "
        f"{names[0]} (below 1: nblstm is faster).",
        "",
        "| T, B, I, H | " + " | ".join(f"{n} ms" for n in names) + " | "
        + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |",
        "|---" * (2 * len(names)) + "|",
    ]
    for shape, medians, ratios in rows:
        lines.append(f"| {', '.join(map(str, shape))} | " + " | ".join(f"{medians[n] * 1e3:.3g}" for n in names)
                     + " | " + " | ".join(f"**{ratios[n]:.2f}**" for n in names[1:]) + " |")
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
