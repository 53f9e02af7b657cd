"""The one central base: what every route's central node shares, written once.

:class:`CentralBase` is a :class:`flwr.serverapp.strategy.Strategy`. It implements Flower's
``start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn) ->
Result`` contract once:

1. :meth:`CentralBase.check_start`: the arguments the route cannot honour are refused, naming the
   fix, before any message is sent (the route's own refusals; what it takes from them, e.g. a first
   model, is returned and kept in the run state);
2. a fresh run state (:class:`RunState`, a route adds its fields in a subclass given as ``State``);
3. identify (:meth:`CentralBase.identify`): which node serves which party, through
   :class:`~flower_vfl.strategies.exchange.Exchange` (the route gives its query and its reader);
4. :meth:`CentralBase.run`: the route's rounds;
5. the run report (:meth:`CentralBase.finish`: the last history row, rounds, wall time, the route's
   own fields, why it stopped) and Flower's ``Result``, built once (:meth:`CentralBase.result` from
   the route's :meth:`~CentralBase.model` and :meth:`~CentralBase.round_metrics`).

An exception in :attr:`CentralBase.STOPS` stops the run: it is recorded (``stopped_reason``,
``failed``), the report written, and raised again (the run fails: no model). One in
:attr:`CentralBase.HALTS` ends it cleanly: recorded, and the ``Result`` holds the rounds done.

The run state is explicit: the hooks take the state and return it (what they compute goes there,
never onto ``self``); ``self`` holds only the configuration the constructor was given. The last
run's state is ``state_``; the read-outs callers use (``history_``, ``final_``, ``privacy_``,
``stopped_reason_``, ``failed_``, and any other ``<field>_`` of the route's state) read it.
Flower's four hooks keep Flower's signatures; a route that uses them reads ``state_`` there.
Glue only: no math here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from typing import ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl.strategies.exchange import Exchange

__all__ = ["CentralBase", "RunState", "history_metrics", "check_num_rounds"]


@dataclasses.dataclass
class RunState:
    """One run of a central node: what :meth:`CentralBase.start` and the route's hooks compute.

    A route adds its own fields in a subclass (``@dataclass class MyState(RunState)``)."""

    #: ``start``'s ``num_rounds`` (None: the route's own default)
    num_rounds: int | None = None
    #: seconds per request (``start``'s ``timeout``, else the constructor's)
    timeout: float = 600.0
    #: what :meth:`CentralBase.check_start` took from ``start``'s arguments (e.g. a first model)
    initial: object = None
    #: Flower's central evaluation (``start``'s ``evaluate_fn``), where the route accepts one
    evaluate_fn: Callable | None = None
    exchange: Exchange | None = None
    #: index -> what its identify reply gave (the route's reader)
    identity: dict = dataclasses.field(default_factory=dict)
    history: list = dataclasses.field(default_factory=list)
    final: dict = dataclasses.field(default_factory=dict)
    #: party -> its privacy report (its own ledger's)
    privacy: dict = dataclasses.field(default_factory=dict)
    stopped_reason: str | None = None
    failed: bool = False
    t0: float = 0.0
    #: round -> the metrics of ``evaluate_fn`` (the Result's ``evaluate_metrics_serverapp``)
    serverapp_metrics: dict = dataclasses.field(default_factory=dict)


def check_num_rounds(num_rounds, unit: str = "") -> None:
    """``num_rounds`` None or an integer >= 1 (``unit``: what a round is, named in the refusal)."""
    if num_rounds is not None and (isinstance(num_rounds, bool) or not isinstance(num_rounds, int)
                                   or num_rounds < 1):
        raise ValueError(f"num_rounds={num_rounds!r}; expected an integer >= 1" + (f" ({unit})" if unit else ""))


def _number(v):
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


def history_metrics(history, round_key: str = "round") -> tuple[dict, dict]:
    """Each history row's numbers as ``train[round]`` and its ``test_*`` numbers as ``evaluate[round]``."""
    train, evaluate = {}, {}
    for row in history:
        k = int(row.get(round_key, row.get("t", 0)))
        vals = {key: _number(v) for key, v in row.items()
                if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)}
        train[k] = {key: v for key, v in vals.items() if not key.startswith("test_")}
        test = {key: v for key, v in vals.items() if key.startswith("test_")}
        if test:
            evaluate[k] = test
    return train, evaluate


class CentralBase(Strategy):
    """The central node of a route (a base: a route sets the class attributes and the hooks).

    A subclass calls ``super().__init__()`` last in its constructor (the empty state is built from
    its configuration) and sets ``num_parties``, ``timeout`` and ``party_wait`` (``party_keys``,
    ``progress`` optional)."""

    #: the route's run state (a :class:`RunState` subclass)
    State: ClassVar[type] = RunState
    #: what an index is called ('party', 'agent') and the run-config key that sets their number
    ROLE: ClassVar[str] = "party"
    COUNT_KEY: ClassVar[str] = "num-parties"
    #: stop the run: recorded, reported, raised again (no model)
    STOPS: ClassVar[tuple] = ()
    #: end the run cleanly: recorded, reported; the Result holds the rounds done
    HALTS: ClassVar[tuple] = ()
    #: the route in prose, for the stop line
    ROUTE: ClassVar[str] = ""

    num_parties: int
    timeout: float = 600.0
    party_wait: float = 0.0
    party_keys = None
    progress = None

    def __init__(self):
        self.state_ = self.new_state()

    # ------------------------------------------------------------------ read-outs of the last run
    @property
    def history_(self) -> list:
        return self.state_.history

    @property
    def final_(self) -> dict:
        return self.state_.final

    @property
    def privacy_(self) -> dict:
        return self.state_.privacy

    @property
    def stopped_reason_(self) -> str | None:
        return self.state_.stopped_reason

    @property
    def failed_(self) -> bool:
        return self.state_.failed

    @property
    def exchange(self) -> Exchange | None:
        return self.state_.exchange

    @property
    def node_to_party(self) -> dict[int, int]:
        return {} if self.state_.exchange is None else self.state_.exchange.node_to_party

    def __getattr__(self, name):
        """``x_``: the last run's state field ``x`` (absent while it is None)."""
        state = self.__dict__.get("state_")
        if name.endswith("_") and not name.startswith("_") and state is not None:
            value = getattr(state, name[:-1], None)
            if value is not None:
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ the route's hooks
    def new_state(self) -> RunState:
        """A fresh state (before any run, and at each :meth:`start`)."""
        return self.State(timeout=float(self.timeout))

    def check_start(self, initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn):
        """Refuse, naming the fix, what the route cannot honour; returns what it takes (``initial``)."""
        raise NotImplementedError

    def identify_query(self, state: RunState) -> tuple[str, RecordDict, str]:
        """(message type, content, what) of the identify query."""
        return "query.identify", RecordDict({"config": ConfigRecord({"want": self.ROLE})}), "the identify query"

    def exchange_kwargs(self, state: RunState) -> dict:
        """The route's further :class:`Exchange` arguments (``on_join``, ``claim_error``, ``wire_dtype``)."""
        return {}

    def read_identity(self, nid: int, rep: Message):
        """``(index, info)`` of an identify reply (checked)."""
        raise NotImplementedError

    def identify(self, grid: Grid, state: RunState) -> RunState:
        """Ask every node which index it serves (:meth:`identify_query`, :meth:`read_identity`)."""
        state.exchange = Exchange(grid, self.num_parties, role=self.ROLE, count_key=self.COUNT_KEY,
                                  timeout=state.timeout, party_wait=self.party_wait, party_keys=self.party_keys,
                                  **self.exchange_kwargs(state))
        message_type, content, what = self.identify_query(state)
        state.identity = state.exchange.identify(message_type, content, self.read_identity, what=what)
        return state

    def run(self, grid: Grid, state: RunState) -> RunState:
        """The route's rounds."""
        raise NotImplementedError

    def report(self, state: RunState) -> dict:
        """The route's fields of the run report (after the last history row and ``rounds``)."""
        return {}

    def model(self, state: RunState) -> dict | None:
        """The Result's arrays (name -> array), or None for an empty ArrayRecord."""
        return None

    def round_metrics(self, state: RunState) -> tuple[dict, dict]:
        """(round -> train metrics, round -> evaluate metrics) for the Result."""
        return history_metrics(state.history)

    def stop_line(self, state: RunState, exc: BaseException) -> str:
        """The log line of a stop (:attr:`STOPS`)."""
        return f"stopping ({self.ROUTE} route): {exc}"

    # ------------------------------------------------------------------ shared steps
    def progress_row(self, rnd: int, row: dict) -> None:
        if self.progress is not None:
            self.progress(rnd, row)

    def evaluate_central(self, state: RunState, rnd: int, arrays: ArrayRecord) -> RunState:
        """Flower's central evaluation of the model after round ``rnd`` (``start``'s ``evaluate_fn``)."""
        if state.evaluate_fn is not None:
            res = state.evaluate_fn(rnd, arrays)
            if res is not None:
                state.serverapp_metrics[rnd] = res
        return state

    def finish(self, state: RunState) -> RunState:
        """The run report ``final``: the last history row, rounds, the route's fields, wall time,
        and why it stopped."""
        final = dict(state.history[-1]) if state.history else {}
        final["rounds"] = len(state.history)
        final.update(self.report(state))
        final["wall_time_s"] = time.perf_counter() - state.t0
        if state.stopped_reason:
            final["stopped_reason"] = state.stopped_reason
        if state.failed:
            final["failed"] = True
        state.final = final
        return state

    def result(self, state: RunState) -> Result:
        """Flower's ``Result`` of the run, built once."""
        arrays = self.model(state)
        res = Result(arrays=ArrayRecord({k: Array(np.asarray(v)) for k, v in (arrays or {}).items()}))
        train, evaluate = self.round_metrics(state)
        for k, vals in train.items():
            res.train_metrics_clientapp[k] = MetricRecord(vals)
        for k, vals in evaluate.items():
            res.evaluate_metrics_clientapp[k] = MetricRecord(vals)
        res.evaluate_metrics_serverapp.update(state.serverapp_metrics)
        return res

    # ------------------------------------------------------------------ Flower's contract
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Flower's ``Strategy.start``: the arguments checked (:meth:`check_start`), the parties
        identified, the route's rounds (:meth:`run`), the report and the ``Result``."""
        initial = self.check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)
        state = self.new_state()
        state.num_rounds, state.initial, state.evaluate_fn = num_rounds, initial, evaluate_fn
        if timeout is not None:
            state.timeout = float(timeout)
        self.state_ = state
        state.t0 = time.perf_counter()
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        try:
            state = self.identify(grid, state)
            state = self.run(grid, state)
        except self.STOPS as exc:
            state.stopped_reason, state.failed = str(exc), True
            log(ERROR, "%s", self.stop_line(state, exc))
            self.state_ = self.finish(state)
            raise
        except self.HALTS as exc:
            state.stopped_reason = str(exc)
            log(WARNING, "stopping: %s", exc)
        self.state_ = state = self.finish(state)
        return self.result(state)
