"""A training demo: an :class:`~nblstm.LSTMCell` learns the adding problem.

The adding problem (Hochreiter and Schmidhuber, 1997): every step of a
sequence carries a random value in ``[0, 1)`` and a marker; exactly two steps
are marked, and the target is the sum of their values. Predicting the mean
(1.0) gives a mean squared error of about 0.167; a model has learnt the task
when its error is far below that. Sequences have random lengths, run with
``sequence_length`` (``dynamic_rnn`` semantics): the prediction is read from
each example's final state, at its own length.

The model is the cell plus a linear read-out of its final output state,
trained with plain NumPy Adam on :meth:`~nblstm.LSTMCell.vjp` gradients.
"""

import sys
import time

import numpy as np

__all__ = ["train", "adding_problem"]

#: Mean squared error that counts as "learnt" (predicting the mean scores about 0.167).
LOSS_THRESHOLD = 0.02


def adding_problem(rng, steps, batch, min_length=None):
    """A batch of the adding problem.

    Parameters
    ----------
    rng : numpy.random.Generator
    steps : int
        ``T``, the padded length.
    batch : int
    min_length : int, optional
        Shortest sequence (default ``T // 2``); lengths are uniform in ``[min_length, T]``.

    Returns
    -------
    tuple
        ``(x [T, B, 2] float32, lengths [B] int64, target [B] float32)``: channel
        0 holds the values, channel 1 the two markers (both inside the length);
        steps past an example's length are zero.

    Examples
    --------
    >>> x, lengths, target = adding_problem(np.random.default_rng(0), steps=6, batch=3)
    >>> x.shape, lengths.shape, target.shape
    ((6, 3, 2), (3,), (3,))
    >>> bool((x[:, :, 1].sum(axis=0) == 2).all())  # two markers per example
    True
    >>> bool(np.allclose((x[:, :, 0] * x[:, :, 1]).sum(axis=0), target))
    True
    """
    min_length = steps // 2 if min_length is None else min_length
    lengths = rng.integers(min_length, steps + 1, batch)
    x = np.zeros((steps, batch, 2), np.float32)
    target = np.zeros(batch, np.float32)
    for b, n in enumerate(lengths):
        x[:n, b, 0] = rng.random(n)
        first, second = rng.choice(n, 2, replace=False)
        x[[first, second], b, 1] = 1.0
        target[b] = x[first, b, 0] + x[second, b, 0]
    return x, lengths.astype(np.int64), target


class _Adam:
    """Adam (Kingma and Ba, 2015) on a dict of arrays, updated in place."""

    def __init__(self, params, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = {k: np.zeros_like(a) for k, a in params.items()}
        self.v = {k: np.zeros_like(a) for k, a in params.items()}
        self.t = 0

    def step(self, params, grads):
        self.t += 1
        correction1 = 1 - self.beta1 ** self.t
        correction2 = 1 - self.beta2 ** self.t
        for k, g in grads.items():
            self.m[k] = self.beta1 * self.m[k] + (1 - self.beta1) * g
            self.v[k] = self.beta2 * self.v[k] + (1 - self.beta2) * g * g
            update = self.lr * (self.m[k] / correction1) / (np.sqrt(self.v[k] / correction2) + self.eps)
            params[k] -= update.astype(params[k].dtype)


def _bar(done, total, width=24):
    filled = int(round(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def train(out=sys.stdout, steps=400, seed=0, batch=64, sequence_steps=16, num_units=24, lr=0.01):
    """Train an LSTMCell on the adding problem and report progress.

    Parameters
    ----------
    out : file-like, default sys.stdout
        Where the progress bar and the results are written.
    steps : int, default 400
        Training steps (one batch each).
    seed : int, default 0
        Seeds the data and the weights: the run is reproducible.
    batch : int, default 64
    sequence_steps : int, default 16
        Padded sequence length ``T``.
    num_units : int, default 24
    lr : float, default 0.01
        Adam's learning rate.

    Returns
    -------
    int
        0 when the final test loss is below :data:`LOSS_THRESHOLD`, 1 otherwise.

    Examples
    --------
    >>> import io
    >>> train(io.StringIO(), steps=2)  # too short to learn: returns 1
    1
    """
    from ..cell import LSTMCell, LSTMStateTuple

    rng = np.random.default_rng(seed)
    cell = LSTMCell(num_units, dtype=np.float32, seed=seed)
    cell.build(2)
    weights = cell.get_weights()
    readout = {
        "w_out": (rng.standard_normal((num_units, 1)) / np.sqrt(num_units)).astype(np.float32),
        "b_out": np.ones(1, np.float32),  # start at the mean of the target
    }
    params = {**weights, **readout}
    adam = _Adam(params, lr)
    test_x, test_len, test_y = adding_problem(np.random.default_rng(seed + 1), sequence_steps, 256)

    def evaluate():
        _, final = cell.run(test_x, sequence_length=test_len)
        pred = (final.h @ params["w_out"])[:, 0] + params["b_out"][0]
        return float(np.mean((pred - test_y) ** 2))

    print(f"nblstm demo: LSTMCell({num_units}) learns the adding problem (T <= {sequence_steps}, batch {batch}, "
          f"Adam lr {lr})", file=out)
    print(f"predicting the mean scores {np.var(test_y):.4f}; the goal is a test MSE below {LOSS_THRESHOLD}", file=out)
    start = time.perf_counter()
    x, lengths, y = adding_problem(rng, sequence_steps, batch)
    cell.vjp(x, sequence_length=lengths)[1](None, (None, np.ones((batch, num_units), np.float32)))
    print(f"first step in {time.perf_counter() - start:.2f} s (it compiles the cell's kernels unless nblstm.warmup() "
          "did, or numba's cache has them)", file=out)
    report_every = max(1, steps // 20)
    running = None
    train_time = 0.0
    for step in range(1, steps + 1):
        x, lengths, y = adding_problem(rng, sequence_steps, batch)
        t0 = time.perf_counter()
        (_, final), backward = cell.vjp(x, sequence_length=lengths)
        pred = (final.h @ params["w_out"])[:, 0] + params["b_out"][0]
        err = pred - y
        loss = float(np.mean(err * err))
        d_pred = (2.0 / batch) * err
        d_h = np.outer(d_pred, params["w_out"][:, 0]).astype(np.float32)
        _, _, grads = backward(None, LSTMStateTuple(None, d_h))
        grads["w_out"] = (final.h.T @ d_pred[:, None]).astype(np.float32)
        grads["b_out"] = np.array([d_pred.sum()], np.float32)
        adam.step(params, grads)
        cell.set_weights({n: params[n] for n in weights})
        train_time += time.perf_counter() - t0
        running = loss if running is None else 0.9 * running + 0.1 * loss
        if step % report_every == 0 or step == steps:
            print(f"{_bar(step, steps)} step {step:4d}/{steps}  loss {running:.4f}  "
                  f"{1e3 * train_time / step:.2f} ms/step", file=out, flush=True)
    final_loss = evaluate()
    learnt = final_loss < LOSS_THRESHOLD
    print(f"test MSE {final_loss:.4f} ({'learnt' if learnt else 'not learnt'}: threshold {LOSS_THRESHOLD}); "
          f"total {time.perf_counter() - start:.1f} s", file=out)
    return 0 if learnt else 1
