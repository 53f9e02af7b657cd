"""The label owner of the FDML-style vertical SGD baseline as a Flower message-API strategy.

Hu et al., "FDML: A Collaborative Machine Learning Framework for Distributed Features"
(KDD 2019), as the ADMM sharing paper compares against. One Flower round trip per SGD step:
the message for step k carries the (epoch, batch) of step k and the gradient of step k-1
(pipelined, so a step costs one round trip, 2 M messages). The math is
:class:`~flower_vfl.routes.vertical_sgd.reference.SGDCentral` (the in-process
:class:`~flower_vfl.routes.vertical_sgd.reference.VerticalSGD` runs the same calls); parties are
identified and replies matched and checked by :mod:`flower_vfl.strategies.exchange`, as on every
central-node path. ``start`` is :class:`~flower_vfl.strategies.base.CentralBase`'s (Flower's
``Strategy.start`` contract); a round is an epoch; the run's intercept, pending gradient and counts
are its state (:class:`SGDState`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.core.losses import get_loss
from flower_vfl.core.rounds import run_rounds
from flower_vfl.routes.vertical_sgd.config import SGDConfig
from flower_vfl.routes.vertical_sgd.reference import (FLOAT_BYTES, SGDCentral, batch_indices, eval_metrics,
                                                       learning_rate, n_batches)
from flower_vfl.strategies.base import CentralBase, RunState, check_num_rounds
from flower_vfl.strategies.exchange import ReplyError, check_release, identity_record

__all__ = ["VerticalSGDStrategy", "SGDState"]


@dataclasses.dataclass
class SGDState(RunState):
    """A vertical SGD run: the label owner's intercept (in ``central``), the gradient waiting for
    the next message, the counts, the held-out decisions."""

    central: SGDCentral | None = None
    #: (the step's public config, g) of the last step, sent with the next message
    pending: tuple | None = None
    steps: int = 0
    messages: int = 0
    bytes: int = 0
    decision_test: np.ndarray | None = None


class VerticalSGDStrategy(CentralBase):
    """Label owner of vertical SGD (the paper's baseline).

    Parameters
    ----------
    y_train, y_test : arrays
        Labels of the aligned training / held-out rows (never sent).
    config : SGDConfig, optional
        The settings (:class:`~flower_vfl.routes.vertical_sgd.config.SGDConfig`: ``num_parties``,
        ``loss``, ``lr``, ``lr_schedule``, ``lr_decay``, ``batch_size``, ``max_epochs``,
        ``fit_intercept``, ``init_scale``, ``seed``, ``eval_every``, ``timeout``, ``party_wait``),
        checked by the parameter table when made.
    progress : callable, optional
        ``progress(epoch, row)`` after each epoch (also settable as the attribute ``progress``).
    **settings :
        The same settings by name (as before the config object), over ``config``; a name that is
        not a field of SGDConfig is refused naming the closest one.

    After :meth:`start`: ``state_`` (:class:`SGDState`) and its read-outs ``history_``, ``final_``,
    ``central`` (the intercept ``central.b``), ``steps_``, ``messages_``, ``bytes_``, ``decision_test_``.
    """

    State = SGDState

    def __init__(self, y_train, y_test=None, config: SGDConfig | None = None, *, progress=None, **settings):
        # every setting checked by the parameter table (config/schema.py, SGD_PARAMS) before any work;
        # the former keyword arguments (num_parties=..., lr=...) still build the config
        self.config = cfg = SGDConfig.build(config, **settings)
        self.loss = get_loss(cfg.loss) if isinstance(cfg.loss, str) else cfg.loss
        self.t = self.loss.encode_labels(np.asarray(y_train))
        self.t_test = None if y_test is None else self.loss.encode_labels(np.asarray(y_test))
        self.fit_intercept = cfg.fit_intercept
        n = self.t.shape[0]
        self.num_parties, self.n = cfg.num_parties, n
        self.batch_size = n if cfg.batch_size is None else min(cfg.batch_size, n)
        learning_rate(0, cfg.lr, cfg.lr_schedule, cfg.lr_decay)          # validates the schedule
        self.lr, self.lr_schedule, self.lr_decay = cfg.lr, cfg.lr_schedule, cfg.lr_decay
        self.max_epochs, self.init_scale, self.seed = cfg.max_epochs, cfg.init_scale, cfg.seed
        self.eval_every, self.timeout, self.party_wait = cfg.eval_every, cfg.timeout, cfg.party_wait
        self.progress = progress
        super().__init__()

    def new_state(self) -> SGDState:
        return SGDState(timeout=float(self.timeout), central=SGDCentral(self.loss, self.t, self.fit_intercept))

    @property
    def central(self) -> SGDCentral:
        """The last run's label-owner math (its intercept ``b``)."""
        return self.state_.central

    @property
    def steps_(self) -> int:
        return self.state_.steps

    @property
    def messages_(self) -> int:
        return self.state_.messages

    @property
    def bytes_(self) -> int:
        return self.state_.bytes

    def summary(self) -> None:
        log(INFO, "\t├── VerticalSGDStrategy: %d parties, loss=%s, N=%d, batch=%d", self.num_parties,
            self.loss.name, self.n, self.batch_size)
        log(INFO, "\t└── lr=%g (%s, decay %g), epochs=%d", self.lr, self.lr_schedule, self.lr_decay, self.max_epochs)

    # ------------------------------------------------------------------ identify
    def read_identity(self, nid, rep):
        info = identity_record(nid, rep)
        party = int(info["party"])
        if int(info["n_rows"]) != self.n:
            raise ValueError(f"party {party} (node {nid}) holds {int(info['n_rows'])} rows but the labels have "
                             f"{self.n}; the parties' samples are not aligned")
        return party, None

    # ------------------------------------------------------------------ messages
    def _exchange(self, state, content, message_type, what):
        """``content`` to every party; party -> reply (matched and checked by the exchange)."""
        return state.exchange.send(lambda p, nid: content, message_type, range(self.num_parties), what)

    def _config(self, **extra):
        return {"seed": self.seed, "init_scale": self.init_scale, "batch_size": self.batch_size,
                "n_rows": self.n, **extra}

    @staticmethod
    def _content(state, cfg) -> RecordDict:
        content = RecordDict({"config": ConfigRecord(cfg)})
        if state.pending is not None:                 # the gradient of the previous step
            pc, g = state.pending
            content["pending"] = ConfigRecord(pc)
            content["grad"] = ArrayRecord({"g": Array(g)})
        return content

    def configure_train(self, server_round, arrays, config, grid) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy drives its own steps in start()")

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy drives its own evaluations in start()")

    def aggregate_train(self, server_round, replies):  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy aggregates each step in train_step()")

    def aggregate_evaluate(self, server_round, replies):  # pragma: no cover
        raise NotImplementedError("VerticalSGDStrategy aggregates its evaluations in evaluate()")

    def train_step(self, state: SGDState, epoch, batch) -> SGDState:
        """One SGD step: the parties' s_m on the batch, then the gradient (step 2)."""
        idx = batch_indices(self.n, self.batch_size, epoch, batch, self.seed)
        lr = learning_rate(state.steps, self.lr, self.lr_schedule, self.lr_decay)
        what = f"epoch {epoch} batch {batch} (train)"
        ok = self._exchange(state, self._content(state, self._config(epoch=epoch, batch=batch)), "train", what)
        s = {p: check_release(rep, p, "s", (idx.size,), what) for p, rep in ok.items()}
        return self.step(state, epoch, s, idx, lr, batch)

    def step(self, state: SGDState, epoch, releases, idx, lr, batch) -> SGDState:
        """Sum the s_m in party order, compute g, step the intercept; g waits for the next message."""
        s_sum = 0.0
        for m in range(self.num_parties):
            s_sum = s_sum + releases[m]
        g = state.central.gradient(idx, s_sum)
        state.central.step(g, lr)
        state.pending = ({"step": state.steps, "epoch": int(epoch), "batch": int(batch),
                          "lr": float(lr), "seed": self.seed, "batch_size": self.batch_size}, g)
        state.steps += 1
        state.messages += 2 * self.num_parties
        state.bytes += 2 * self.num_parties * idx.size * FLOAT_BYTES
        return state

    def evaluate(self, state: SGDState, epoch) -> tuple[SGDState, dict]:
        """Deliver the pending gradient and read D_m x_m on train and test rows: the metrics."""
        what = f"epoch {epoch} (evaluate)"
        ok = self._exchange(state, self._content(state, self._config(epoch=epoch)), "evaluate", what)
        state.pending = None
        f = sum(check_release(ok[p], p, "s_train", (self.n,), what) for p in range(self.num_parties))
        train_loss = self.loss.mean(f + state.central.b, self.t)
        pens = [ok[p].content.metric_records["meta"].get("penalty") for p in range(self.num_parties)]
        if any(v is None for v in pens):
            raise ReplyError(f"{what}: a party did not report its penalty")
        out = {"train_loss": train_loss, "objective": train_loss + float(sum(pens))}
        if self.t_test is not None:
            shape = (self.t_test.shape[0],)
            ft = sum(check_release(ok[p], p, "s_test", shape, what) for p in range(self.num_parties))
            state.decision_test = ft + state.central.b
            out.update(eval_metrics(self.loss, state.decision_test, self.t_test))
        return state, {k: float(v) for k, v in out.items()}

    # ---------------------------------------------------------------------- loop
    def check_start(self, initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn):
        """``initial_arrays`` must be empty (each party draws its own x_m from the shared seed),
        ``train_config`` / ``evaluate_config`` empty and ``evaluate_fn`` None (the label owner holds
        no model: the x_m stay on the parties)."""
        check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)

    def train_epoch(self, state: SGDState, epoch) -> dict:
        """Epoch ``epoch``: ``ceil(N / batch_size)`` steps (:meth:`train_step`); its history row."""
        for j in range(n_batches(self.n, self.batch_size)):
            state = self.train_step(state, epoch, j)
        return {"round": epoch, "steps": state.steps, "messages": state.messages, "bytes": state.bytes,
                "lr": state.pending[0]["lr"]}

    def run(self, grid: Grid, state: SGDState) -> SGDState:
        """``num_rounds`` epochs (None: ``max_epochs``) of ``ceil(N / batch_size)`` steps, in the one
        round loop (:func:`~flower_vfl.core.rounds.run_rounds`): a round is an epoch (:meth:`train_epoch`),
        evaluated (:meth:`evaluate`) every ``eval_every`` epochs and after the last."""
        epochs = self.max_epochs if state.num_rounds is None else int(state.num_rounds)

        def evaluate(epoch, row):
            row.update(self.evaluate(state, epoch)[1])

        def on_round(epoch, row, stop):
            row["elapsed_s"] = time.perf_counter() - state.t0       # the evaluation included
            self.progress_row(epoch, row)

        run_rounds(lambda epoch: (self.train_epoch(state, epoch), False), epochs, history=state.history,
                   evaluate=evaluate, eval_every=self.eval_every, on_round=on_round)
        return state

    def report(self, state: SGDState) -> dict:
        return {"intercept": float(state.central.b)}

    def model(self, state: SGDState) -> dict:
        """The Result's arrays: the intercept (the x_m stay on the parties)."""
        return {"intercept": np.atleast_1d(float(state.central.b))}


def check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn) -> None:
    """Flower's start() arguments vertical SGD cannot honour: refused, naming the fix."""
    if initial_arrays is not None and len(initial_arrays):
        raise ValueError(f"initial_arrays holds {sorted(initial_arrays.keys())}; vertical SGD has no global model "
                         "to send (each party draws its own x_m from the seed): pass ArrayRecord()")
    check_num_rounds(num_rounds, "epochs")
    for name, cfg in (("train_config", train_config), ("evaluate_config", evaluate_config)):
        if cfg is not None and len(cfg):
            raise ValueError(f"{name} holds {sorted(cfg.keys())}; the parties take no settings from the label owner "
                             "besides the protocol's (epoch, batch, step size, seed): pass None")
    if evaluate_fn is not None:
        raise ValueError("evaluate_fn: the label owner holds no model to evaluate (each x_m stays on its party); "
                         "test metrics come from the parties' scores: give the strategy y_test and pass "
                         "evaluate_fn=None")

