"""The label owner of the FDML-style vertical SGD baseline as a Flower message-API strategy.

Hu et al., "FDML: A Collaborative Machine Learning Framework for Distributed Features"
(KDD 2019), as the ADMM sharing paper compares against. One Flower round trip per SGD step:
the message for step k carries the (epoch, batch) of step k and the gradient of step k-1
(pipelined, so a step costs one round trip, 2 M messages). The math is
:class:`~flower_vfl.routes.vertical_sgd.reference.SGDCentral` (the in-process
:class:`~flower_vfl.routes.vertical_sgd.reference.VerticalSGD` runs the same calls); parties are
identified and replies matched and checked by :mod:`flower_vfl.strategies.exchange`, as on every
central-node path. ``start`` keeps Flower's ``Strategy.start`` contract; a round is an epoch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl.core.losses import get_loss
from flower_vfl.routes.vertical_sgd.reference import (FLOAT_BYTES, SGDCentral, batch_indices, eval_metrics,
                                                       learning_rate, n_batches)
from flower_vfl.strategies.exchange import Exchange, ReplyError, check_release, identity_record

__all__ = ["VerticalSGDStrategy"]


class VerticalSGDStrategy(Strategy):
    """Label owner of vertical SGD (the paper's baseline).

    Parameters
    ----------
    y_train, y_test : arrays
        Labels of the aligned training / held-out rows (never sent).
    num_parties : int, default=2
    loss : str, default='logistic'
    lr, lr_schedule, lr_decay, batch_size, max_epochs, fit_intercept, init_scale, seed :
        As :class:`~flower_vfl.routes.vertical_sgd.reference.VerticalSGD` (``seed`` = its ``random_state``);
        ``init_scale`` and ``seed`` are sent to the parties, which draw their own x_m.
    eval_every : int, default=1
        Evaluate (objective, test metrics) every k epochs and after the last.
    timeout : float, default=600
    party_wait : float, default=0
        Seconds to wait for a missing party (at identify, and for a lost node to come back), as
        :class:`~flower_vfl.strategies.exchange.Exchange`. A restarted SGD party has lost its x_m,
        so the default stops the run naming the party.
    progress : callable, optional
        ``progress(epoch, row)`` after each epoch (also settable as the attribute ``progress``).
    """

    def __init__(self, y_train, y_test=None, num_parties=2, loss="logistic", lr=0.1, lr_schedule="constant",
                 lr_decay=0.0, batch_size=256, max_epochs=20, fit_intercept=True, init_scale=0.01, seed=0,
                 eval_every=1, timeout=600.0, party_wait=0.0, progress=None):
        self.loss = get_loss(loss) if isinstance(loss, str) else loss
        self.t = self.loss.encode_labels(np.asarray(y_train))
        self.t_test = None if y_test is None else self.loss.encode_labels(np.asarray(y_test))
        self.central = SGDCentral(self.loss, self.t, fit_intercept)
        n = self.t.shape[0]
        self.num_parties, self.n = int(num_parties), n
        self.batch_size = n if batch_size is None else min(int(batch_size), n)
        learning_rate(0, lr, lr_schedule, lr_decay)          # validates the schedule
        self.lr, self.lr_schedule, self.lr_decay = float(lr), lr_schedule, float(lr_decay)
        self.max_epochs, self.init_scale, self.seed = int(max_epochs), float(init_scale), int(seed)
        self.eval_every, self.timeout, self.party_wait = int(eval_every), float(timeout), float(party_wait)
        self.exchange: Exchange | None = None
        self.history_: list[dict] = []
        self.final_: dict = {}
        self.steps_ = self.messages_ = self.bytes_ = 0
        self._pending = None
        self.progress = progress

    def summary(self) -> None:
        log(INFO, "\t├── VerticalSGDStrategy: %d parties, loss=%s, N=%d, batch=%d", self.num_parties,
            self.loss.name, self.n, self.batch_size)
        log(INFO, "\t└── lr=%g (%s, decay %g), epochs=%d", self.lr, self.lr_schedule, self.lr_decay, self.max_epochs)

    # ------------------------------------------------------------------ messages
    @property
    def node_to_party(self) -> dict[int, int]:
        return {} if self.exchange is None else self.exchange.node_to_party

    def _exchange(self, content, message_type, what):
        """``content`` to every party; party -> reply (matched and checked by the exchange)."""
        return self.exchange.send(lambda p, nid: content, message_type, range(self.num_parties), what)

    def _read_identity(self, nid, rep):
        info = identity_record(nid, rep)
        party = int(info["party"])
        if int(info["n_rows"]) != self.n:
            raise ValueError(f"party {party} (node {nid}) holds {int(info['n_rows'])} rows but the labels have "
                             f"{self.n}; the parties' samples are not aligned")
        return party, None

    def identify(self, grid: Grid) -> dict[int, int]:
        """Ask every node which party it serves; map node id -> party id."""
        self.exchange = Exchange(grid, self.num_parties, timeout=self.timeout, party_wait=self.party_wait)
        self.exchange.identify("query.identify", RecordDict({"config": ConfigRecord({"want": "party"})}),
                               self._read_identity)
        return self.node_to_party

    def _config(self, **extra):
        return {"seed": self.seed, "init_scale": self.init_scale, "batch_size": self.batch_size,
                "n_rows": self.n, **extra}

    def _content(self, cfg) -> RecordDict:
        content = RecordDict({"config": ConfigRecord(cfg)})
        if self._pending is not None:                 # the gradient of the previous step
            pc, g = self._pending
            content["pending"] = ConfigRecord(pc)
            content["grad"] = ArrayRecord({"g": Array(g)})
        return content

    def configure_train(self, server_round, arrays, config, grid) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy drives its own steps in start()")

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy drives its own evaluations in start()")

    def train_step(self, grid, epoch, batch):
        """One SGD step: the parties' s_m on the batch, then the gradient (step 2)."""
        idx = batch_indices(self.n, self.batch_size, epoch, batch, self.seed)
        lr = learning_rate(self.steps_, self.lr, self.lr_schedule, self.lr_decay)
        what = f"epoch {epoch} batch {batch} (train)"
        ok = self._exchange(self._content(self._config(epoch=epoch, batch=batch)), "train", what)
        s = {p: check_release(rep, p, "s", (idx.size,), what) for p, rep in ok.items()}
        self.aggregate_train(epoch, s, idx, lr, batch)

    def aggregate_train(self, server_round, replies, idx=None, lr=None, batch=None):
        """Sum the s_m in party order, compute g, step the intercept; g waits for the next message."""
        s_sum = 0.0
        for m in range(self.num_parties):
            s_sum = s_sum + replies[m]
        g = self.central.gradient(idx, s_sum)
        self.central.step(g, lr)
        self._pending = ({"step": self.steps_, "epoch": int(server_round), "batch": int(batch),
                          "lr": float(lr), "seed": self.seed, "batch_size": self.batch_size}, g)
        self.steps_ += 1
        self.messages_ += 2 * self.num_parties
        self.bytes_ += 2 * self.num_parties * idx.size * FLOAT_BYTES
        return None, MetricRecord({"step": self.steps_})

    def evaluate(self, grid, epoch):
        """Deliver the pending gradient and read D_m x_m on train and test rows."""
        what = f"epoch {epoch} (evaluate)"
        ok = self._exchange(self._content(self._config(epoch=epoch)), "evaluate", what)
        self._pending = None
        return self.aggregate_evaluate(epoch, ok)

    def aggregate_evaluate(self, server_round, replies):
        what = f"epoch {server_round} (evaluate)"
        f = sum(check_release(replies[p], p, "s_train", (self.n,), what) for p in range(self.num_parties))
        train_loss = self.loss.mean(f + self.central.b, self.t)
        pens = [replies[p].content.metric_records["meta"].get("penalty") for p in range(self.num_parties)]
        if any(v is None for v in pens):
            raise ReplyError(f"{what}: a party did not report its penalty")
        out = {"train_loss": train_loss, "objective": train_loss + float(sum(pens))}
        if self.t_test is not None:
            shape = (self.t_test.shape[0],)
            ft = sum(check_release(replies[p], p, "s_test", shape, what) for p in range(self.num_parties))
            self.decision_test_ = ft + self.central.b
            out.update(eval_metrics(self.loss, self.decision_test_, self.t_test))
        return MetricRecord({k: float(v) for k, v in out.items()})

    # ---------------------------------------------------------------------- loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Identify the parties, then ``num_rounds`` epochs (None: ``max_epochs``) of
        ``ceil(N / batch_size)`` steps; Flower's ``Strategy.start`` contract.

        ``initial_arrays`` must be empty (each party draws its own x_m from the shared seed),
        ``train_config`` / ``evaluate_config`` empty and ``evaluate_fn`` None (the label owner holds
        no model: the x_m stay on the parties); ``timeout``: seconds per request (None: the
        constructor's). Returns Flower's ``Result``: ``arrays`` the intercept,
        ``train_metrics_clientapp[epoch]`` the epoch's history row, ``evaluate_metrics_clientapp``
        its test metrics. ``history_`` and ``final_`` are kept as before."""
        check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)
        if num_rounds is not None:
            self.max_epochs = int(num_rounds)
        if timeout is not None:
            self.timeout = timeout
        t0 = time.perf_counter()
        self.summary()
        self.identify(grid)
        for epoch in range(1, self.max_epochs + 1):
            for j in range(n_batches(self.n, self.batch_size)):
                self.train_step(grid, epoch, j)
            row = {"round": epoch, "steps": self.steps_, "messages": self.messages_, "bytes": self.bytes_,
                   "lr": self._pending[0]["lr"]}
            if epoch == self.max_epochs or (self.eval_every and epoch % self.eval_every == 0):
                row.update(dict(self.evaluate(grid, epoch)))
            row["elapsed_s"] = time.perf_counter() - t0
            self.history_.append(row)
            if self.progress is not None:
                self.progress(epoch, row)
        self.final_ = dict(self.history_[-1], rounds=self.max_epochs, wall_time_s=time.perf_counter() - t0,
                           intercept=float(self.central.b))
        return flower_result(self.history_, {"intercept": np.atleast_1d(float(self.central.b))})


def check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn) -> None:
    """Flower's start() arguments vertical SGD cannot honour: refused, naming the fix."""
    if initial_arrays is not None and len(initial_arrays):
        raise ValueError(f"initial_arrays holds {sorted(initial_arrays.keys())}; vertical SGD has no global model "
                         "to send (each party draws its own x_m from the seed): pass ArrayRecord()")
    if num_rounds is not None and (isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1):
        raise ValueError(f"num_rounds={num_rounds!r}; expected an integer >= 1 (epochs)")
    for name, cfg in (("train_config", train_config), ("evaluate_config", evaluate_config)):
        if cfg is not None and len(cfg):
            raise ValueError(f"{name} holds {sorted(cfg.keys())}; the parties take no settings from the label owner "
                             "besides the protocol's (epoch, batch, step size, seed): pass None")
    if evaluate_fn is not None:
        raise ValueError("evaluate_fn: the label owner holds no model to evaluate (each x_m stays on its party); "
                         "test metrics come from the parties' scores: give the strategy y_test and pass "
                         "evaluate_fn=None")


def flower_result(history, arrays) -> Result:
    """Flower's ``Result`` of a run: ``arrays`` (name -> array), each history row's numbers as
    ``train_metrics_clientapp[round]`` and its ``test_*`` numbers as ``evaluate_metrics_clientapp[round]``."""
    res = Result(arrays=ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}))
    for row in history:
        k = int(row.get("round", row.get("t", 0)))
        vals = {key: (int(v) if isinstance(v, (int, np.integer)) else float(v)) for key, v in row.items()
                if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)}
        res.train_metrics_clientapp[k] = MetricRecord({key: v for key, v in vals.items() if not key.startswith("test_")})
        test = {key: v for key, v in vals.items() if key.startswith("test_")}
        if test:
            res.evaluate_metrics_clientapp[k] = MetricRecord(test)
    return res
