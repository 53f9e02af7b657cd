"""Vertical SGD on the FDML composite model (Hu et al., KDD 2019): the paper's baseline, in process.

The in-process reference of the ``vertical-sgd`` route (no Flower import): the route's central node
(:mod:`.central`) and party (:mod:`.party`) call exactly these functions.

The model is the same as ADMM sharing's, f_i = sum_m D_m^i x_m + b. One step on a
mini-batch B (|B| rows, the same rows at every party):

1. party m sends its local predictions s_m = D_m[B] x_m (|B| values);
2. the label owner sums them, f_B = sum_m s_m + b, and sends every party the per-sample
   gradient of the averaged loss with respect to the prediction,
   g_i = l'(f_i, t_i) / |B| (|B| values), and steps its intercept b <- b - eta sum_i g_i;
3. party m steps its own block, x_m <- x_m - eta (D_m[B]^T g + lam x_m)
   (the gradient of (1/|B|) sum_{i in B} l_i + lam/2 ||x_m||^2 with respect to x_m).

Only |B|-vectors cross the wire, as in ADMM sharing (N-vectors). An epoch is one pass over
the N rows in ``ceil(N / batch_size)`` steps, each costing 2 M messages (M up, M down) of
|B| float64 values; the figures compare SGD epochs with ADMM rounds as the paper does and
report the messages and bytes of both.

The batches of an epoch are a permutation drawn from ``SeedSequence(seed, spawn_key=(epoch,))``,
so every party derives them from the shared seed and the (epoch, batch) numbers alone.
:class:`SGDParty` and :class:`SGDCentral` are the two sides; the in-process
:class:`VerticalSGD` and the Flower strategy / client call exactly these.
"""

from __future__ import annotations

import math
import numbers
import time
from functools import lru_cache

import numpy as np

from flower_vfl.core.losses import get_loss
from flower_vfl.core.rounds import run_rounds
from flower_vfl.core.validation import check_blocks

__all__ = ["VerticalSGD", "SGDParty", "SGDCentral", "batch_indices", "learning_rate", "init_coef",
           "SCHEDULES", "eval_metrics"]

SCHEDULES = ("constant", "inverse", "sqrt")
FLOAT_BYTES = 8


def learning_rate(step, lr, schedule="constant", decay=0.0):
    """Step size of SGD step ``step`` (0-based).

    'constant': lr; 'inverse': lr / (1 + decay * step) (Robbins-Monro, converges on strongly
    convex problems); 'sqrt': lr / sqrt(1 + decay * step).
    """
    if schedule == "constant":
        return float(lr)
    if schedule == "inverse":
        return float(lr) / (1.0 + decay * step)
    if schedule == "sqrt":
        return float(lr) / math.sqrt(1.0 + decay * step)
    raise ValueError(f"lr_schedule={schedule!r} is not supported; choose one of {SCHEDULES}")


@lru_cache(maxsize=4)
def _permutation(n, epoch, seed):
    perm = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(epoch),))).permutation(n)
    perm.setflags(write=False)
    return perm


def n_batches(n, batch_size):
    return -(-int(n) // int(batch_size))


def batch_indices(n, batch_size, epoch, batch, seed):
    """Rows of mini-batch ``batch`` (0-based) of ``epoch`` (1-based): shared by all parties."""
    if not 0 <= batch < n_batches(n, batch_size):
        raise ValueError(f"batch={batch} is outside 0..{n_batches(n, batch_size) - 1} for N={n}, "
                         f"batch_size={batch_size}")
    return _permutation(int(n), int(epoch), int(seed))[batch * batch_size:(batch + 1) * batch_size]


def init_coef(d, party, seed, scale):
    """The paper initializes SGD's parameters "with random numbers": x_m ~ N(0, scale^2 I),
    from the party's own stream ``SeedSequence(seed, spawn_key=(1000 + party,))``."""
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(1000 + int(party),)))
    return float(scale) * rng.standard_normal(int(d))


class SGDParty:
    """Party m's side: local predictions on a batch and the SGD step on its own block."""

    def __init__(self, D, lam, x0):
        self.D, self.lam = D, float(lam)
        self.x = np.array(x0, dtype=float)

    def predict(self, idx):
        """s_m = D_m[B] x_m (step 1)."""
        return np.asarray(self.D[idx] @ self.x, dtype=float).ravel()

    def step(self, idx, g, lr):
        """x_m <- x_m - lr (D_m[B]^T g + lam x_m) (step 3)."""
        grad = np.asarray(self.D[idx].T @ g, dtype=float).ravel() + self.lam * self.x
        self.x = self.x - lr * grad

    def penalty(self):
        """lam/2 ||x_m||^2 (this party's share of the objective)."""
        return 0.5 * self.lam * float(self.x @ self.x)


class SGDCentral:
    """The label owner's side: gradient with respect to the predictions, intercept step."""

    def __init__(self, loss, t, fit_intercept=True):
        self.loss, self.t, self.fit_intercept = loss, t, bool(fit_intercept)
        self.n = t.shape[0]
        self.b = 0.0

    def gradient(self, idx, s_sum):
        """g_i = l'(f_i, t_i) / |B| at f_B = sum_m s_m + b (step 2)."""
        return self.loss.grad(np.asarray(s_sum, dtype=float) + self.b, self.t[idx]) / len(idx)

    def step(self, g, lr):
        """b <- b - lr sum_i g_i (the unpenalized intercept)."""
        if self.fit_intercept:
            self.b -= lr * float(np.sum(g))


def _check_positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {name}={v!r}")


def _check_nonneg(name, v, strict=False):
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) and (v > 0 if strict else v >= 0)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'> 0' if strict else '>= 0'}; got {name}={v!r}")


class VerticalSGD:
    """FDML-style vertical SGD (the baseline of the paper's Figures 1-2).

    Minimizes ``(1/N) sum_i l(sum_m D_m^i x_m + b, t_i) + lam/2 sum_m ||x_m||^2`` by
    mini-batch SGD on the composite model (module docstring).

    Parameters
    ----------
    loss : {'logistic', 'squared'}, default='logistic'
        A scalar-output smooth loss of :mod:`flower_vfl.core.losses`.
    lam : float, default=1e-4
    lr : float, default=0.1
        Initial step size eta_0.
    lr_schedule : {'constant', 'inverse', 'sqrt'}, default='constant'
        See :func:`learning_rate`; ``lr_decay`` is per step.
    lr_decay : float, default=0.0
    batch_size : int or None, default=256
        Rows per step; None = full batch (gradient descent, one step per epoch).
    max_epochs : int, default=20
        An epoch is one pass over the N rows.
    fit_intercept : bool, default=True
    init_scale : float, default=0.01
        x_m ~ N(0, init_scale^2 I) (the paper: "initialize ... SGD ... with random numbers").
    random_state : int, default=0
        Seeds the initialization and the batch order.
    verbose : bool, default=False
        tqdm progress bar over epochs.
    callback : callable(epoch, engine) or None

    Attributes
    ----------
    coef_ : list of ndarray
    intercept_ : float
    history_ : list of dict
        Per epoch: round (= epoch), steps, lr, objective, train_loss, messages, bytes,
        elapsed_s and, with ``eval_set``, test_loss and test_accuracy.
    n_epochs_, n_steps_, messages_, bytes_ : int
        Training messages (2 M per step) and their float64 payload in bytes.
    """

    def __init__(self, loss="logistic", lam=1e-4, lr=0.1, lr_schedule="constant", lr_decay=0.0,
                 batch_size=256, max_epochs=20, fit_intercept=True, init_scale=0.01, random_state=0,
                 verbose=False, callback=None):
        self.loss, self.lam, self.lr = loss, lam, lr
        self.lr_schedule, self.lr_decay = lr_schedule, lr_decay
        self.batch_size, self.max_epochs = batch_size, max_epochs
        self.fit_intercept, self.init_scale = fit_intercept, init_scale
        self.random_state, self.verbose, self.callback = random_state, verbose, callback

    def _validate(self, n):
        _check_nonneg("lam", self.lam)
        _check_nonneg("lr", self.lr, strict=True)
        _check_nonneg("lr_decay", self.lr_decay)
        _check_nonneg("init_scale", self.init_scale)
        _check_positive_int("max_epochs", self.max_epochs)
        if self.batch_size is not None:
            _check_positive_int("batch_size", self.batch_size)
        learning_rate(0, self.lr, self.lr_schedule, self.lr_decay)
        if isinstance(self.random_state, bool) or not isinstance(self.random_state, numbers.Integral):
            raise ValueError(f"random_state must be an integer (parties derive the batches from it); "
                             f"got random_state={self.random_state!r}")
        loss = get_loss(self.loss) if isinstance(self.loss, str) else self.loss
        if loss.n_outputs != 1 or loss.name not in ("logistic", "squared", "sigmoid"):
            raise ValueError(f"loss={loss.name!r} is not supported by VerticalSGD; use 'logistic', "
                             "'squared' or 'sigmoid'")
        return loss, n if self.batch_size is None else min(int(self.batch_size), n)

    def fit(self, X_blocks, y, eval_set=None):
        """Run ``max_epochs`` epochs; ``eval_set=(X_blocks_test, y_test)`` adds test metrics."""
        y = np.asarray(y)
        blocks = check_blocks(X_blocks, n_rows=y.shape[0])
        n = y.shape[0]
        loss, bs = self._validate(n)
        t = loss.encode_labels(y)
        self.loss_, self.n_features_in_ = loss, [D.shape[1] for D in blocks]
        parties = [SGDParty(D, self.lam, init_coef(D.shape[1], m, self.random_state, self.init_scale))
                   for m, D in enumerate(blocks)]
        central = SGDCentral(loss, t, self.fit_intercept)
        M, nb = len(blocks), n_batches(n, bs)
        self.history_, self.n_steps_, self.messages_, self.bytes_ = [], 0, 0, 0
        eval_t = None if eval_set is None else loss.encode_labels(np.asarray(eval_set[1]))
        start = time.perf_counter()

        def epoch_step(epoch):
            for j in range(nb):
                idx = batch_indices(n, bs, epoch, j, self.random_state)
                lr = learning_rate(self.n_steps_, self.lr, self.lr_schedule, self.lr_decay)
                g = central.gradient(idx, sum(p.predict(idx) for p in parties))
                for p in parties:
                    p.step(idx, g, lr)
                central.step(g, lr)
                self.n_steps_ += 1
                self.messages_ += 2 * M
                self.bytes_ += 2 * M * len(idx) * FLOAT_BYTES
            self.coef_ = [p.x.copy() for p in parties]
            self.intercept_ = float(central.b)
            f = sum(D @ x for D, x in zip(blocks, self.coef_)) + self.intercept_
            train_loss = loss.mean(f, t)
            return {"round": epoch, "steps": self.n_steps_, "lr": lr,
                    "objective": train_loss + sum(p.penalty() for p in parties), "train_loss": train_loss,
                    "messages": self.messages_, "bytes": self.bytes_,
                    "elapsed_s": time.perf_counter() - start}, False

        def evaluate(epoch, row):
            row.update(eval_metrics(loss, self.decision_function(eval_set[0]), eval_t))

        bar = None
        if self.verbose:
            from tqdm.auto import tqdm
            bar = tqdm(total=self.max_epochs, desc="SGD epochs", unit="epoch")

        def on_round(epoch, row, stop):
            self.n_epochs_ = epoch
            if bar is not None:
                bar.set_postfix(objective=f"{row['objective']:.6g}")
                bar.update()
            if self.callback is not None:
                self.callback(epoch, self)

        try:      # the one round loop (core/rounds.py), as the route's central node: an epoch is a round
            run_rounds(epoch_step, self.max_epochs, history=self.history_,
                       evaluate=None if eval_set is None else evaluate, eval_every=1, on_round=on_round)
        finally:
            if bar is not None:
                bar.close()
        return self

    def decision_function(self, X_blocks):
        if not hasattr(self, "coef_"):
            raise AttributeError("this VerticalSGD is not fitted yet; call fit(X_blocks, y) first")
        blocks = check_blocks(X_blocks)
        if [D.shape[1] for D in blocks] != self.n_features_in_:
            raise ValueError(f"blocks have widths {[D.shape[1] for D in blocks]}; the model was fitted "
                             f"on widths {self.n_features_in_}")
        return np.asarray(sum(D @ x for D, x in zip(blocks, self.coef_)) + self.intercept_).ravel()

    def predict(self, X_blocks):
        f = self.decision_function(X_blocks)
        return self.loss_.predict(f)

    def predict_proba(self, X_blocks):
        f = self.decision_function(X_blocks)
        return self.loss_.predict_proba(f)

    def objective(self, X_blocks, y):
        """(1/N) sum l + lam/2 sum ||x_m||^2 at the fitted coefficients."""
        f = self.decision_function(X_blocks)
        return self.loss_.mean(f, self.loss_.encode_labels(np.asarray(y))) + \
            0.5 * self.lam * sum(float(x @ x) for x in self.coef_)


def eval_metrics(loss, f, t):
    """test_loss (mean loss) and, for classification losses, test_accuracy."""
    out = {"test_loss": loss.mean(f, t)}
    if loss.name != "squared":
        out["test_accuracy"] = float(np.mean(loss.predict(f) == loss.predict(t)))
    return out
