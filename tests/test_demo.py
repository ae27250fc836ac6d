"""The training demo learns its task and reports progress; the demo command warms the kernels up first."""

import argparse
import io

import numpy as np

from nblstm._tools import cli, demo
from nblstm.precompile import GROUPS


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


def test_demo_warms_up_first_and_says_what_it_compiles():
    out = io.StringIO()
    args = argparse.Namespace(train_steps=2, shape=[3, 2, 3, 8], dtype="float32", repeats=1, jobs=1)
    assert cli.demo(args, out) == 1  # two steps learn nothing: the fused ops' part is skipped
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("nblstm demo: compiling the kernels it runs")
    groups = [group for group in GROUPS if group != "LSTMCell.stepper"]  # the demo runs no stepper
    assert [line.strip() for line in lines[1:4]] == [f"compiling {g} float32 ({k}/3)" for k, g in enumerate(groups, 1)]
    assert lines[4].startswith("  kernels ready in ")
    assert any(line.startswith("first step in ") for line in lines)
