"""The central node of vertical ADMM sharing as a Flower message-API strategy.

Paper: Hu et al., "Learning Privately over Distributed Features: An ADMM Sharing
Approach" (Algorithm 1). The strategy owns the labels, z, y and the intercept; it learns
which node serves which party through an identify query, sends every party its own
message (the N-vectors q = a_hat - z and y, Alg. 1 lines 3-4 and 12), and runs the same
:class:`~flower_vfl.core.central.CentralUpdate` as the in-process engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..core.central import CentralUpdate, residuals
from ..core.engine import default_rho, private_schedule
from ..core.losses import get_loss
from ..core.validation import check_params

__all__ = ["VerticalADMMStrategy", "PartyRefused"]


class PartyRefused(RuntimeError):
    """A party refused to release (its privacy budget is spent)."""


class VerticalADMMStrategy(Strategy):
    """Central node (label owner) of vertical ADMM sharing.

    Parameters
    ----------
    y_train : array (N,)
        Labels of the aligned training rows (never sent anywhere).
    y_test : array (N_test,) or None, default=None
        Labels of the held-out rows, for the evaluation rounds' metrics.
    num_parties : int, default=2
    loss : str, default='logistic'
    rho : float or 'auto', default='auto'
    alpha : float, default=1.0
        Over-relaxation.
    variant : {'sharing', 'paper'}, default='sharing'
    fit_intercept : bool, default=True
    max_rounds : int, default=50
    tol, tol_abs : float, default=0.0, 1e-9
        Boyd's residual stopping rule (tol=0 runs every round).
    eval_every : int, default=0
        Evaluate every k rounds (0: only after the last round).
    timeout : float, default=600
        Seconds to wait for the parties' replies in each round.
    """

    def __init__(self, y_train, y_test=None, num_parties=2, loss="logistic", rho="auto", alpha=1.0,
                 variant="sharing", fit_intercept=True, max_rounds=50, tol=0.0, tol_abs=1e-9,
                 eval_every=0, timeout=600.0):
        check_params(0.0, rho, alpha, 1.0, max_rounds, tol)
        if variant not in ("sharing", "paper"):
            raise ValueError(f"variant={variant!r}; choose 'sharing' or 'paper'")
        self.loss = get_loss(loss) if isinstance(loss, str) else loss
        self.t = self.loss.encode_labels(np.asarray(y_train))
        self.t_test = None if y_test is None else self.loss.encode_labels(np.asarray(y_test))
        self.num_parties = int(num_parties)
        n = self.t.shape[0]
        self.central = CentralUpdate(self.loss, self.t, default_rho(self.loss, n) if rho in (None, "auto", 0) else rho,
                                     alpha=alpha, theta=1.0 if variant == "paper" else 1.0 / num_parties,
                                     fit_intercept=fit_intercept)
        self.max_rounds, self.tol, self.tol_abs = max_rounds, tol, tol_abs
        self.eval_every, self.timeout = eval_every, timeout
        self.node_to_party: dict[int, int] = {}
        #: party -> planned training releases, for the parties that declared themselves private
        self.private_parties: dict[int, int] = {}
        self.history_: list[dict] = []
        self.privacy_: dict[int, dict] = {}
        self.final_: dict = {}
        self.stopped_reason_: str | None = None

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        c = self.central
        log(INFO, "\t├── VerticalADMMStrategy: %d parties, loss=%s, N=%d", self.num_parties, self.loss.name, c.n)
        log(INFO, "\t└── rho=%.3g alpha=%g theta=%g intercept=%s", c.rho, c.alpha, c.theta, c.fit_intercept)

    def identify(self, grid: Grid) -> dict[int, int]:
        """Ask every node which party it serves; map node id -> party id."""
        nodes = list(grid.get_node_ids())
        msgs = [Message(RecordDict({"config": ConfigRecord({"want": "party"})}), dst_node_id=nid,
                        message_type="query.identify") for nid in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=self.timeout))
        mapping, seen = {}, {}
        for rep in replies:
            nid = rep.metadata.src_node_id
            if rep.has_error():
                raise RuntimeError(f"node {nid} failed to identify itself: {rep.error.reason}")
            info = rep.content["identity"]
            party, n_rows = int(info["party"]), int(info["n_rows"])
            if party in seen:
                raise ValueError(f"nodes {seen[party]} and {nid} both claim party {party}; give each "
                                 "SuperNode a distinct partition-id in its node config")
            if n_rows != self.central.n:
                raise ValueError(f"party {party} (node {nid}) holds {n_rows} rows but the labels have "
                                 f"{self.central.n}; the parties' samples are not aligned")
            seen[party] = nid
            mapping[nid] = party
            if bool(info.get("private", False)):
                self.private_parties[party] = int(info.get("train_rounds", 0))
        missing = sorted(set(range(self.num_parties)) - set(seen))
        if missing:
            raise RuntimeError(f"parties {missing} did not answer the identify query (nodes seen: "
                               f"{sorted(nodes)}): num-parties={self.num_parties} but {len(nodes)} SuperNodes "
                               "answered. Start one SuperNode per party (simulation: --federation-config "
                               f"\"num-supernodes={self.num_parties}\") or set num-parties={len(nodes)}")
        self.node_to_party = mapping
        return mapping

    # ------------------------------------------------------------ the 4 hooks
    def _messages(self, content: RecordDict, message_type: str, parties=None) -> list[Message]:
        order = sorted(self.node_to_party, key=self.node_to_party.get)
        return [Message(content, dst_node_id=nid, message_type=message_type) for nid in order
                if parties is None or self.node_to_party[nid] in parties]

    def _round_content(self, server_round, **extra) -> RecordDict:
        c = self.central
        return RecordDict({
            "vectors": ArrayRecord({"q": Array(np.asarray(c.q)), "y": Array(np.asarray(c.y))}),
            "config": ConfigRecord({"round": int(server_round), "rho": float(c.rho),
                                    "alpha": float(c.alpha), "theta": float(c.theta), **extra}),
        })

    def configure_train(self, server_round, arrays, config, grid, parties=None) -> Iterable[Message]:
        """Alg. 1 line 12: every (active) party gets q = a_hat - z, y and the scalars."""
        return self._messages(self._round_content(server_round), "train", parties)

    def _collect(self, replies, key, parties=None):
        """Replies keyed by party, in party order; errors and refusals stop the run."""
        by_party = {}
        for rep in replies:
            nid = rep.metadata.src_node_id
            party = self.node_to_party.get(nid)
            if party is None:
                log(WARNING, "ignoring a reply from unknown node %s", nid)
                continue
            if rep.has_error():
                raise RuntimeError(f"party {party} (node {nid}) failed: {rep.error.reason}")
            if "privacy" in rep.content:
                self.privacy_[party] = json.loads(str(rep.content["privacy"]["report"]))
            if "refusal" in rep.content:
                raise PartyRefused(f"party {party} refused: {rep.content['refusal']['reason']}")
            by_party[party] = rep.content["release"][key].numpy()
        expected = range(self.num_parties) if parties is None else parties
        missing = sorted(set(expected) - set(by_party))
        if missing:
            raise RuntimeError(f"no reply from parties {missing} within {self.timeout} s")
        return by_party

    def aggregate_train(self, server_round, replies, parties=None):
        """Alg. 1 lines 9-11: sum the s_m (an idle party counts with its last release, zero
        before its first), then the z- and y-updates."""
        self._last_s.update(self._collect(replies, "s", parties))
        s_sum = 0.0
        for m in range(self.num_parties):
            s_sum = s_sum + self._last_s.get(m, 0.0)
        c = self.central
        r, d = c.step(s_sum)
        self._last = (r, d, s_sum)
        row = {"round": server_round, "train_loss": self.loss.mean(s_sum + c.b, self.t),
               "primal_residual": r, "dual_residual": d, "rho": c.rho}
        self.history_.append(row)
        return None, MetricRecord({k: float(v) for k, v in row.items()})

    def configure_evaluate(self, server_round, arrays, config, grid, final=False) -> Iterable[Message]:
        """Ask for D_test x_m. In the final evaluation private parties also get the last
        q, y: they make their unreleased final x-update first (:func:`private_schedule`)."""
        c = self.central
        cfg = {"round": int(server_round), "rho": float(c.rho), "theta": float(c.theta),
               "n_outputs": int(self.loss.n_outputs)}
        msgs = self._messages(RecordDict({"config": ConfigRecord(cfg)}), "evaluate",
                              set(range(self.num_parties)) - set(self.private_parties))
        if self.private_parties:
            content = RecordDict({"config": ConfigRecord(cfg)}) if not final else \
                self._round_content(server_round, n_outputs=int(self.loss.n_outputs), final_update=True)
            msgs += self._messages(content, "evaluate", set(self.private_parties))
        return msgs

    def aggregate_evaluate(self, server_round, replies):
        f = sum(self._collect(replies, "s_test").values()) + self.central.b
        self.decision_test_ = f
        out = {"test_loss": self.loss.mean(f, self.t_test)}
        if self.loss.name != "squared":
            pred = self.loss.predict(f)
            truth = self.loss.predict(self.t_test) if self.t_test.ndim == 1 else self.loss.predict(self.t_test)
            out["test_accuracy"] = float(np.mean(pred == truth))
        self.history_[-1].update(out)
        return MetricRecord({k: float(v) for k, v in out.items()})

    def _evaluate(self, grid, k, final=False):
        replies = grid.send_and_receive(self.configure_evaluate(k, None, None, grid, final=final),
                                        timeout=self.timeout)
        self.aggregate_evaluate(k, replies)

    # ------------------------------------------------------------------- loop
    def start(self, grid: Grid, timeout: float | None = None, progress=None):
        """Identify the parties, then run rounds until the stopping rule or ``max_rounds``.

        With private parties the rounds follow :func:`~flower_vfl.core.engine.private_schedule`
        (as the in-process engine does): the non-private parties first, then the private
        parties' declared number of training rounds, then the final evaluation, in which the
        private parties make their last, unreleased x-update.

        A party's refusal (budget spent) stops the run cleanly: ``stopped_reason_`` says why
        and the rounds done so far are kept.
        """
        if timeout is not None:
            self.timeout = timeout
        t0 = time.perf_counter()
        self.summary()
        self.identify(grid)
        self._last_s: dict[int, np.ndarray] = {}
        private = [m in self.private_parties for m in range(self.num_parties)]
        phases = private_schedule(private, self.max_rounds, list(self.private_parties.values()))
        k = 0
        try:
            for i_phase, (n_rounds, active, use_tol) in enumerate(phases):
                parties = {m for m in range(self.num_parties) if active[m]}
                last_phase = i_phase == len(phases) - 1
                for j in range(1, n_rounds + 1):
                    k += 1
                    msgs = self.configure_train(k, None, None, grid, parties)
                    self.aggregate_train(k, grid.send_and_receive(msgs, timeout=self.timeout), parties)
                    self.history_[-1].update(parties=len(parties), elapsed_s=time.perf_counter() - t0)
                    r, d, s_sum = self._last
                    eps_pri, eps_dual = residuals(r, d, s_sum, self.central.z, self.central.y, self.tol,
                                                  self.tol_abs)
                    stop = use_tol and self.tol > 0 and r <= eps_pri and d <= eps_dual
                    done = last_phase and (j == n_rounds or stop)
                    if self.t_test is not None and not done and self.eval_every and k % self.eval_every == 0:
                        self._evaluate(grid, k)
                    if progress is not None:
                        progress(k, self.history_[-1])
                    if stop:
                        break
            if self.t_test is not None:
                self._evaluate(grid, k, final=True)
        except PartyRefused as exc:
            self.stopped_reason_ = str(exc)
            log(WARNING, "stopping: %s", exc)
        self.final_ = dict(self.history_[-1]) if self.history_ else {}
        self.final_["rounds"] = k
        self.final_["wall_time_s"] = time.perf_counter() - t0
        self.final_["intercept"] = np.asarray(self.central.b).tolist()
        if self.stopped_reason_:
            self.final_["stopped_reason"] = self.stopped_reason_
        return self
