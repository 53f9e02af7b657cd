"""The central node (label owner) of the stacked SSP route as a Flower strategy (issue 21 item 2).

Several private parties that beat one party alone, through Flower (docs/privacy_parties.md):

1. identify (``query.ssp_identify``): which node serves which party, its row counts, whether it is
   private (every party must be), its target clip c_v and whether its budget covers one release;
2. one release (``query.ssp_release``): party m gets v_m = kappa_m (t - pi) and replies with the
   scores D_test,m x~_m of the held-out rows and the scalar x~_m^T g~_m (its one SSP release,
   charged in its own ledger; :class:`~flower_vfl.clients.party_ssp.SSPPartyClient`);
3. the label owner's calibration, post-processing only: the held-out rows are the unlabelled
   pool, cross-fitted (each half scored with the LDA calibration computed on the other half's
   scores, no test label used): :func:`~flower_vfl.privacy.ssp.cross_fitted_decision`, the same
   functions :class:`~flower_vfl.estimator.stacked.StackedPrivateParties` calls in process.

Flower's contract, written once in :class:`~flower_vfl.strategies.base.CentralBase`:
``start(grid, initial_arrays=ArrayRecord(), num_rounds=..., timeout=...) -> Result``; every message
goes through :mod:`flower_vfl.strategies.exchange` (identify, send, replies matched by
``reply_to_message_id``, the party-wait rule, "did not answer"). Steps 1 and 2 (the identity checks,
the release request), the stop rule and the run report are the one-release routes' shared part
(:class:`~flower_vfl.strategies.one_release.OneReleaseStrategy`). Glue only: the math is in
:mod:`flower_vfl.privacy.ssp`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.errors import UserError
from flower_vfl.privacy.ssp import cross_fit_halves, cross_fitted_decision
from flower_vfl.strategies.exchange import PartyLost, check_release, keep_report
from flower_vfl.strategies.one_release import OneReleaseState, OneReleaseStrategy
from flower_vfl.strategies.vertical_admm import DEFAULT_MAX_RELEASE

__all__ = ["StackedSSPStrategy", "StackedSSPState", "CalibrationFailed", "SSP_ROUND"]

#: the round number of the one release (the party keeps it under its ledger run "<run>/ssp")
SSP_ROUND = 1


class CalibrationFailed(UserError, ValueError):
    """The released scores do not give a usable calibration (too much noise for the pool's size)."""


@dataclasses.dataclass
class StackedSSPState(OneReleaseState):
    """A stacked SSP run: each party's x~^T g~, the held-out scores, the two halves and their calibrations."""

    xg: dict = dataclasses.field(default_factory=dict)
    scores_test: np.ndarray | None = None
    halves: tuple | None = None
    calibrations: list | None = None


class StackedSSPStrategy(OneReleaseStrategy):
    """Label owner of the stacked SSP route over ``num_parties`` private parties.

    Parameters
    ----------
    y_train : array (N,)
        Binary labels of the aligned training rows (never sent: the parties get v = kappa (t - pi)).
    y_test : array (N_test,) or None
        Held-out labels, for the test metrics only (the calibration uses no label of a scored row).
    num_parties : int, default=2
    timeout : float, default=600
        Seconds to wait for the replies to one request (``round-timeout``).
    party_wait : float, default=120
        Seconds to wait for a missing party (``party-wait``).
    party_keys : str, dict or None
        Party -> SHA-256 fingerprint of the SuperNode key allowed to serve it (``party-keys``).
    max_release : float, default=1e6
        A reply's value beyond +-max_release is refused (``max-release``).
    halves_seed : int, default=12345
        The fixed public permutation that splits the held-out rows into the two calibration halves
        (as simulations/private_parties.py; no noise, no data).
    progress : callable(round, row) or None

    After :meth:`start`: ``state_`` (:class:`StackedSSPState`) and its read-outs ``history_``,
    ``final_``, ``privacy_``, ``decision_test_``, ``calibrations_``, ``halves_``, ``scores_test_``.
    """

    State = StackedSSPState
    ROUTE, ROUTE_KEY, QUERY, RELEASE, ROUND = "stacked SSP", "stacked-ssp", "ssp", "SSP", SSP_ROUND
    STOPS = OneReleaseStrategy.STOPS + (CalibrationFailed,)
    RELEASE_DESC = "one SSP release"
    EXPOSED_ROWS = ("scored_rows", "not protected: the held-out rows' scores are released (the calibration pool)")

    def __init__(self, y_train, y_test=None, num_parties=2, timeout=600.0, party_wait=120.0, party_keys=None,
                 max_release=DEFAULT_MAX_RELEASE, halves_seed=12345, progress=None):
        from flower_vfl.config.schema import check_params      # the one parameter table (schema.PARAMS)
        check_params("StackedSSPStrategy", dict(num_parties=num_parties, timeout=timeout, party_wait=party_wait,
                                                max_release=max_release))
        self._init_labels(y_train, y_test, num_parties, timeout, party_wait, party_keys, max_release, progress)
        if not self.max_release > 0:
            raise ValueError(f"max_release={max_release!r}; expected a bound > 0")
        self.halves_seed = int(halves_seed)
        super().__init__()

    def summary(self) -> None:
        log(INFO, "\t└── StackedSSPStrategy: %d private parties, one SSP release each, N=%d", self.num_parties,
            self.n_train)

    # ------------------------------------------------------------------ the release
    def _read_release(self, party, rep, n_test, privacy):
        """(held-out scores, x~^T g~) of a party's reply, checked (:func:`check_release`)."""
        what = "the SSP release"
        keep_report(rep, party, privacy, what)
        s_test = check_release(rep, party, "s_test", (n_test,), what, bound=self.max_release)
        xg = check_release(rep, party, "xg", (1,), what, bound=self.max_release * self.n_train)
        return s_test, float(xg[0])

    def release_messages(self, state: StackedSSPState) -> list[Message]:
        """The one release request per party (``query.ssp_release``: its target and the round)."""
        node_of = state.exchange.node_of()
        return [self.release_message(state, p, node_of[p]) for p in range(self.num_parties) if p in node_of]

    def read_releases(self, state: StackedSSPState, replies: Iterable[Message]) -> StackedSSPState:
        """Check each party's release (held-out scores, x~^T g~, privacy report)."""
        n_test = state.identity[0]["n_test"]
        scores = {}
        for rep in replies:
            m = state.exchange.party_of(rep)
            scores[m], state.xg[m] = self._read_release(m, rep, n_test, state.privacy)
        missing = sorted(set(range(self.num_parties)) - set(scores))
        if missing:
            raise PartyLost(f"parties {missing} did not answer the SSP release")
        state.scores_test = np.column_stack([scores[m] for m in range(self.num_parties)])
        return state

    def calibrate(self, state: StackedSSPState) -> StackedSSPState:
        """The label owner's cross-fitted calibration of the held-out scores
        (:func:`~flower_vfl.privacy.ssp.cross_fitted_decision`) and, with ``y_test``, the test metrics."""
        parties = range(self.num_parties)
        state.halves = cross_fit_halves(state.scores_test.shape[0], self.halves_seed)
        try:
            f, state.calibrations = cross_fitted_decision(state.scores_test, [state.xg[m] for m in parties],
                                                          [state.kappa[m] for m in parties], self.n_train, self.pi,
                                                          state.halves)
        except ValueError as exc:
            raise CalibrationFailed(f"the label owner's calibration on the {state.scores_test.shape[0]} held-out rows "
                                    f"failed: {exc}. The parties' releases are spent (each ledger holds them); a "
                                    "larger dataset or a larger budget per party gives usable scores") from None
        state.decision_test = f
        state.metrics = {}
        if self.t_test is not None:
            state.metrics["test_loss"] = float(self.loss.mean(f, self.t_test))
            state.metrics["test_accuracy"] = float(np.mean(self.loss.predict(f) == self.loss.predict(self.t_test)))
        return state

    # ------------------------------------------------------------ Flower's 4 hooks (on ``state_``)
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The one release request per party. ``arrays`` / ``config``: Flower's global model and
        free-form config; this route has neither (each x~_m stays on its party, a party's settings
        are its node config's), so they are not read."""
        return self.release_messages(self.state_)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Check each party's release; no global model (``None``); the metric: the releases read."""
        state = self.read_releases(self.state_, replies)
        return None, MetricRecord({"releases": int(state.scores_test.shape[1])})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Nothing to send: the held-out scores came with the release (post-processing of x~_m)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """The cross-fitted calibration (:meth:`calibrate`); the test metrics."""
        return MetricRecord(dict(self.calibrate(self.state_).metrics))

    # ------------------------------------------------------------ the run
    def run(self, grid, state: StackedSSPState) -> StackedSSPState:
        """One release per party, the cross-fitted calibration: the held-out decisions. A refusal (a
        spent budget), a lost or failed party or an invalid reply stops the run and is raised again."""
        got = state.exchange.send_messages(self.release_messages(state), "SSP release",
                                           rebuild=lambda p, nid: self.release_message(state, p, nid),
                                           parties=range(self.num_parties))
        state = self.read_releases(state, [got[m] for m in sorted(got)])
        state = self.calibrate(state)
        row = {"round": SSP_ROUND, "parties": self.num_parties, **state.metrics}
        state.history = [row]
        self.progress_row(SSP_ROUND, row)
        return state

    def model(self, state: StackedSSPState) -> dict:
        """The two halves' calibrations (weights per party's score, intercepts)."""
        cal = state.calibrations
        return {"weights_half0": np.asarray(cal[0][0], float), "weights_half1": np.asarray(cal[1][0], float),
                "intercepts": np.array([cal[0][1], cal[1][1]])}

    def round_metrics(self, state: StackedSSPState) -> tuple[dict, dict]:
        return {}, ({SSP_ROUND: dict(state.metrics)} if "test_loss" in state.metrics else {})
