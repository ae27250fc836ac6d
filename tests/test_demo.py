"""The training demo learns its task and reports progress."""

import io

import numpy as np

from nblstm._tools import demo


def test_adding_problem_batches():
    x, lengths, target = demo.adding_problem(np.random.default_rng(0), 10, 8)
    assert x.shape == (10, 8, 2) and x.dtype == np.float32
    assert ((lengths >= 5) & (lengths <= 10)).all()
    for b, n in enumerate(lengths):
        assert x[:, b, 1].sum() == 2 and not x[n:, b].any()
        np.testing.assert_allclose(target[b], x[:, b, 0] @ x[:, b, 1], rtol=1e-6)


def test_train_learns_and_reports():
    out = io.StringIO()
    assert demo.train(out, steps=300, seed=0) == 0
    text = out.getvalue()
    assert "[########################] step  300/300" in text
    assert "ms/step" in text and "learnt" in text
    losses = [float(line.split("loss ")[1].split()[0]) for line in text.splitlines() if "loss " in line]
    assert losses[-1] < losses[0] / 10
