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

Flower's contract as :class:`~flower_vfl.strategies.vertical_admm.VerticalADMMStrategy`:
``start(grid, initial_arrays=ArrayRecord(), num_rounds=..., timeout=...) -> Result``; every message
goes through :mod:`flower_vfl.strategies.exchange` (identify, send, replies matched by
``reply_to_message_id``, the party-wait rule, "did not answer"). Steps 1 and 2 (the identity checks,
the release request), the stop rule and the run report are the one-release routes' shared part
(:class:`~flower_vfl.strategies.one_release.OneReleaseStrategy`). Glue only: the math is in
:mod:`flower_vfl.privacy.ssp`.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from flower_vfl.errors import UserError
from flower_vfl.privacy.ssp import cross_fit_halves, cross_fitted_decision
from flower_vfl.strategies.exchange import PartyLost, check_release, keep_report
from flower_vfl.strategies.one_release import OneReleaseStrategy
from flower_vfl.strategies.vertical_admm import DEFAULT_MAX_RELEASE

__all__ = ["StackedSSPStrategy", "CalibrationFailed", "SSP_ROUND"]

#: the round number of the one release (the party keeps it under its ledger run "<run>/ssp")
SSP_ROUND = 1


class CalibrationFailed(UserError, ValueError):
    """The released scores do not give a usable calibration (too much noise for the pool's size)."""


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
    """

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
        self.xg_: dict[int, float] = {}
        self.scores_test_: np.ndarray | None = None

    def summary(self) -> None:
        log(INFO, "\t└── StackedSSPStrategy: %d private parties, one SSP release each, N=%d", self.num_parties,
            self.n_train)

    # ------------------------------------------------------------------ the release
    def _read_release(self, party, rep, n_test):
        """(held-out scores, x~^T g~) of a party's reply, checked (:func:`check_release`)."""
        what = "the SSP release"
        keep_report(rep, party, self.privacy_, what)
        s_test = check_release(rep, party, "s_test", (n_test,), what, bound=self.max_release)
        xg = check_release(rep, party, "xg", (1,), what, bound=self.max_release * self.n_train)
        return s_test, float(xg[0])

    # ------------------------------------------------------------ Flower's 4 hooks
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The one release request per party (``query.ssp_release``: its target and the round).
        ``arrays`` / ``config``: Flower's global model and free-form config; this route has neither
        (each x~_m stays on its party, a party's settings are its node config's), so they are not read."""
        node_of = self.exchange.node_of()
        return [self._release_message(p, node_of[p]) for p in range(self.num_parties) if p in node_of]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Check each party's release (held-out scores, x~^T g~, privacy report); a refusal stops the
        run (:class:`PartyRefused`). No global model (``None``); the metric: the releases read."""
        n_test = self.identity_[0]["n_test"]
        scores = {}
        for rep in replies:
            m = self.exchange.party_of(rep)
            scores[m], self.xg_[m] = self._read_release(m, rep, n_test)
        missing = sorted(set(range(self.num_parties)) - set(scores))
        if missing:
            raise PartyLost(f"parties {missing} did not answer the SSP release")
        self.scores_test_ = np.column_stack([scores[m] for m in range(self.num_parties)])
        return None, MetricRecord({"releases": len(scores)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Nothing to send: the held-out scores came with the release (post-processing of x~_m)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """The label owner's cross-fitted calibration of the held-out scores
        (:func:`~flower_vfl.privacy.ssp.cross_fitted_decision`) and, with ``y_test``, the test metrics."""
        parties = range(self.num_parties)
        self.halves_ = cross_fit_halves(self.scores_test_.shape[0], self.halves_seed)
        try:
            f, self.calibrations_ = cross_fitted_decision(self.scores_test_, [self.xg_[m] for m in parties],
                                                          [self.kappa_[m] for m in parties], self.n_train, self.pi,
                                                          self.halves_)
        except ValueError as exc:
            raise CalibrationFailed(f"the label owner's calibration on the {self.scores_test_.shape[0]} held-out rows "
                                    f"failed: {exc}. The parties' releases are spent (each ledger holds them); a "
                                    "larger dataset or a larger budget per party gives usable scores") from None
        self.decision_test_ = f
        out = {}
        if self.t_test is not None:
            out["test_loss"] = float(self.loss.mean(f, self.t_test))
            out["test_accuracy"] = float(np.mean(self.loss.predict(f) == self.loss.predict(self.t_test)))
        return MetricRecord(out)

    def fit(self, grid) -> np.ndarray:
        """Identify, one release per party, the cross-fitted calibration: the held-out decisions."""
        self.identify(grid)
        got = self.exchange.send_messages(self.configure_train(SSP_ROUND, ArrayRecord(), ConfigRecord(), grid),
                                          "SSP release", rebuild=self._release_message,
                                          parties=range(self.num_parties))
        self.aggregate_train(SSP_ROUND, [got[m] for m in sorted(got)])
        self.metrics_ = self.aggregate_evaluate(SSP_ROUND, self.configure_evaluate(SSP_ROUND, ArrayRecord(),
                                                                                   ConfigRecord(), grid))
        return self.decision_test_

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = 1,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Run the route (one exchange; ``num_rounds`` is accepted for Flower's contract and means
        nothing here: each party makes exactly one release). A refusal (a spent budget), a lost or
        failed party or an invalid reply stops the run and is raised again: the run fails."""
        t0 = self._start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)
        row = {"round": SSP_ROUND, "parties": self.num_parties, **{k: float(v) for k, v in self.metrics_.items()}}
        self.history_ = [row]
        if self.progress is not None:
            self.progress(SSP_ROUND, row)
        self._finish(t0)
        res = Result(arrays=ArrayRecord({"weights_half0": Array(np.asarray(self.calibrations_[0][0], float)),
                                         "weights_half1": Array(np.asarray(self.calibrations_[1][0], float)),
                                         "intercepts": Array(np.array([self.calibrations_[0][1],
                                                                       self.calibrations_[1][1]]))}))
        if "test_loss" in row:
            res.evaluate_metrics_clientapp[SSP_ROUND] = MetricRecord(
                {"test_loss": row["test_loss"], "test_accuracy": row["test_accuracy"]})
        return res
