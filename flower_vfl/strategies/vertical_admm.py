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
from logging import ERROR, INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flower_vfl.core.accel import acceleration_name, make_accelerator
from flower_vfl.core.central import CentralUpdate, residuals
from flower_vfl.core.schedule import default_rho, private_schedule
from flower_vfl.core.losses import get_loss
from flower_vfl.privacy.label_dp import privatize_labels
from flower_vfl.core.validation import check_params
from flower_vfl.io.checkpoint import load_checkpoint, save_checkpoint
from flower_vfl.reporting.report import to_jsonable
from flower_vfl.core.scoring import combine
from flower_vfl.strategies.replies import PartyFailed, PartyLost, ReplyError, check_release
from flower_vfl.strategies.resilience import ResilientRounds, load_party_keys

__all__ = ["VerticalADMMStrategy", "PartyRefused", "PartyFailed", "PartyLost", "ReplyError"]


class PartyRefused(RuntimeError):
    """A party refused to release (its privacy budget is spent)."""


class VerticalADMMStrategy(ResilientRounds, Strategy):
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
        Seconds to wait for the parties' replies in each round (``round-timeout``).
    party_wait : float, default=120
        Seconds to wait for a missing party: at identify until every party has a node, and for
        a lost SuperNode to come back (a restarted node is re-identified). 0: do not wait.
    stragglers : {'wait', 'stale'}, default='wait'
        'stale': a party that misses a round counts with its last release (bounded staleness).
    max_staleness : int, default=5
        Most consecutive rounds a party's last release may stand in for it.
    state_dir : str or None, default=None
        Folder of the atomic per-round checkpoint (None: no checkpoint).
    resume : str or None, default=None
        A state folder of an earlier run to continue (bitwise the same iterates).
    party_keys : str, dict or None, default=None
        Party -> SHA-256 fingerprint of the SuperNode auth key allowed to serve it (a dict or
        the path of a JSON file); a node whose key and claimed party disagree is refused.
    acceleration : {'auto', 'anderson', 'spectral', 'anderson+spectral', 'none'}, default='auto'
        As the engine's (core/accel.py; run config ``acceleration``). Anderson is off with
        alpha != 1, private parties, stragglers='stale', or a penalty other than 'l2' / a
        constraint (pass the parties' ``penalty`` and ``constraint`` from the run config);
        'auto' also leaves it off when it would hold more than 128 MiB (N, K and the number of
        parties decide, as in the engine). The choice is in ``acceleration_``.
    penalty, constraint : the parties' penalty and constraint (only decide the acceleration).
    label_epsilon : float or None, default=None
        Label DP (loss='logistic'): randomized response on ``y_train`` once, here, and the
        forward-corrected loss; None, 0 or inf: labels not protected (``label-epsilon``).
    label_seed : None, int or numpy Generator, default=None
        Source of the label flips (None: OS entropy); never sent or reported.
    """

    def __init__(self, y_train, y_test=None, num_parties=2, loss="logistic", rho="auto", alpha=1.0,
                 variant="sharing", fit_intercept=True, max_rounds=50, tol=0.0, tol_abs=1e-9,
                 eval_every=0, timeout=600.0, party_wait=120.0, stragglers="wait", max_staleness=5,
                 state_dir=None, resume=None, party_keys=None, acceleration="auto", penalty="l2", constraint=None,
                 label_epsilon=None, label_seed=None):
        check_params(0.0, rho, alpha, 1.0, max_rounds, tol)
        if variant not in ("sharing", "paper"):
            raise ValueError(f"variant={variant!r}; choose 'sharing' or 'paper'")
        self.loss = get_loss(loss) if isinstance(loss, str) else loss
        # label DP (privacy/label_dp.py, the engine's code): the true y_train is used only here
        self.loss, y_train, self.label_privacy_ = privatize_labels(self.loss, np.asarray(y_train),
                                                                   label_epsilon, label_seed)
        self.label_epsilon = None if self.label_privacy_ is None else self.label_privacy_.epsilon
        self.t = self.loss.encode_labels(np.asarray(y_train))
        self.t_test = None if y_test is None else self.loss.encode_labels(np.asarray(y_test))
        self.num_parties = int(num_parties)
        n = self.t.shape[0]
        self.central = CentralUpdate(self.loss, self.t, default_rho(self.loss, n, penalty) if rho in (None, "auto", 0) else rho,
                                     alpha=alpha, theta=1.0 if variant == "paper" else 1.0 / num_parties,
                                     fit_intercept=fit_intercept)
        self.max_rounds, self.tol, self.tol_abs = max_rounds, tol, tol_abs
        self.eval_every, self.round_timeout = eval_every, float(timeout)
        if stragglers not in ("wait", "stale"):
            raise ValueError(f"stragglers={stragglers!r}; choose 'wait' or 'stale'")
        self.party_wait, self.stragglers, self.max_staleness = float(party_wait), stragglers, int(max_staleness)
        self.state_dir, self.resume = state_dir or None, resume or None
        self.party_keys = load_party_keys(party_keys, self.num_parties) if isinstance(party_keys, str) and \
            party_keys else {int(m): str(v) for m, v in (party_keys or {}).items()}
        self.failed_ = False
        make_accelerator(acceleration, self.central, [])          # checks the name
        #: 'anderson': core/accel.py, the engine's default; off with private parties or stragglers='stale'
        self.acceleration, self._acc, self._qs = acceleration, None, None
        self.penalty, self.constraint = penalty, constraint   # the parties' (run config): see make_accelerator
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

    # ------------------------------------------------------------ the 4 hooks
    def _messages(self, content: RecordDict, message_type: str, parties=None) -> list[Message]:
        order = sorted(self.node_to_party, key=self.node_to_party.get)
        return [Message(content, dst_node_id=nid, message_type=message_type) for nid in order
                if parties is None or self.node_to_party[nid] in parties]

    def _round_content(self, server_round, party=None, **extra) -> RecordDict:
        c = self.central
        q = c.q if self._qs is None or party is None else self._qs[party]   # per party when accelerated
        if party in self.__dict__.get("_resync", ()) and party in self._last_s:
            # a restarted party that lost its state (s_m = 0): q - s_m/theta gives it the same
            # x-update target z_loc = s_m - theta q as the party that kept s_m (eq. 6, alpha = 1)
            q = q - self._last_s[party] / c.theta
        return RecordDict({
            "vectors": ArrayRecord({"q": Array(np.asarray(q)), "y": Array(np.asarray(c.y))}),
            "config": ConfigRecord({"round": int(server_round), "rho": float(c.rho),
                                    "alpha": float(c.alpha), "theta": float(c.theta), **extra}),
        })

    def configure_train(self, server_round, arrays, config, grid, parties=None) -> Iterable[Message]:
        """Alg. 1 line 12: every (active) party gets q = a_hat - z, y and the scalars."""
        return self._messages(self._round_content(server_round), "train", parties)

    def _release(self, rep, party, key, shape, what) -> np.ndarray:
        """A reply's checked release; a refusal stops the run (:class:`PartyRefused`)."""
        records = rep.content.config_records
        if "privacy" in records:
            try:
                self.privacy_[party] = json.loads(str(records["privacy"]["report"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ReplyError(f"party {party}, {what}: unreadable privacy report ({exc})") from None
        if "refusal" in records:
            raise PartyRefused(f"party {party} refused: {records['refusal'].get('reason', '')}")
        return check_release(rep, party, key, shape, what)

    def _train_round(self, grid, k, parties):
        """Send round k to ``parties``, check the replies, aggregate (Alg. 1 lines 9-12).

        ``stragglers='stale'``: a party that misses the round counts with its last release
        (bounded staleness: at most ``max_staleness`` rounds in a row, then it is waited for)."""
        content = self._round_content(k) if self._qs is None and not self.__dict__.get("_resync") else None
        build = lambda p, nid: Message(content or self._round_content(k, party=p), dst_node_id=nid,  # noqa: E731
                                       message_type="train")
        what = f"round {k} (train)"
        if self.stragglers == "stale":
            got, lost = self._exchange(grid, build, parties, what, stale_ok=True)
            over = {p for p in lost if self._stale.get(p, 0) + 1 > self.max_staleness}
            if over:
                log(WARNING, "parties %s missed %d rounds in a row (max-staleness): waiting", sorted(over),
                    self.max_staleness)
                got.update(self._exchange(grid, build, over, what))
        else:
            got = self._exchange(grid, build, parties, what)
        shape = self.central.z.shape
        fresh = {p: self._release(rep, p, "s", shape, what) for p, rep in sorted(got.items())}
        self.__dict__.get("_resync", set()).difference_update(fresh)
        for p in parties:
            self._stale[p] = 0 if p in fresh else self._stale.get(p, 0) + 1
        self.aggregate_train(k, fresh, parties)
        self.history_[-1]["stale"] = len(set(parties) - set(fresh))
        # the objective, as the engine writes it, when every party reports lam R(x_m) (non-private)
        pens = self.__dict__.setdefault("_penalties", {})
        for p, rep in got.items():
            meta = rep.content.metric_records.get("meta")
            if p in fresh and meta is not None and "penalty" in meta:
                pens[p] = float(meta["penalty"])
        if len(pens) == self.num_parties:
            self.history_[-1]["objective"] = self.history_[-1]["train_loss"] + sum(pens.values())

    def aggregate_train(self, server_round, replies, parties=None):
        """Alg. 1 lines 9-11: sum the s_m (an idle or stale party counts with its last release,
        zero before its first), then the z- and y-updates. ``replies``: party -> checked s_m."""
        self._last_s.update(replies)
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

    def _eval_content(self, server_round, party, final=False) -> RecordDict:
        """Ask for D_test x_m. In the final evaluation private parties also get the last
        q, y: they make their unreleased final x-update first (:func:`private_schedule`)."""
        c = self.central
        cfg = {"round": int(server_round), "rho": float(c.rho), "alpha": float(c.alpha),
               "theta": float(c.theta), "n_outputs": int(self.loss.n_outputs)}
        if final and party in self.private_parties:
            return self._round_content(server_round, n_outputs=int(self.loss.n_outputs), final_update=True)
        return RecordDict({"config": ConfigRecord(cfg)})

    def configure_evaluate(self, server_round, arrays, config, grid, final=False) -> Iterable[Message]:
        return [Message(self._eval_content(server_round, p, final), dst_node_id=nid, message_type="evaluate")
                for nid, p in sorted(self.node_to_party.items(), key=lambda t: t[1])]

    def aggregate_evaluate(self, server_round, replies, suffix=""):
        """``replies``: party -> checked D_test x_m. ``suffix='_nonprivate'``: the score of the
        non-private parties alone (private parties are never asked before their final update).
        The scores are combined by :func:`flower_vfl.core.scoring.combine`, as in the predict job."""
        f = combine(replies, self.central.b, sorted(replies) if suffix else range(self.num_parties), "test scores")
        if not suffix:
            self.decision_test_ = f
        # test labels are clean: with label DP score them with the plain logistic loss (log-loss)
        test_loss = get_loss("logistic") if self.label_privacy_ is not None else self.loss
        out = {"test_loss" + suffix: test_loss.mean(f, self.t_test)}
        if self.loss.name != "squared":
            pred = self.loss.predict(f)
            truth = self.loss.predict(self.t_test) if self.t_test.ndim == 1 else self.loss.predict(self.t_test)
            out["test_accuracy" + suffix] = float(np.mean(pred == truth))
        self.history_[-1].update(out)
        return MetricRecord({k: float(v) for k, v in out.items()})

    def _evaluate(self, grid, k, final=False):
        """Score the test rows. Before the final update a private party is not asked (it
        releases its model once, at the end): the score is then the non-private parties'
        alone, recorded as ``test_loss_nonprivate`` / ``test_accuracy_nonprivate``."""
        what = f"round {k} ({'final ' if final else ''}evaluate)"
        build = lambda p, nid: Message(self._eval_content(k, p, final), dst_node_id=nid,  # noqa: E731
                                       message_type="evaluate")
        ask = set(range(self.num_parties)) if final else set(range(self.num_parties)) - set(self.private_parties)
        got = self._exchange(grid, build, ask, what)
        shape = self.t_test.shape[:1] + self.central.z.shape[1:]
        suffix = "" if ask == set(range(self.num_parties)) else "_nonprivate"
        return self.aggregate_evaluate(k, {p: self._release(rep, p, "s_test", shape, what) for p, rep in got.items()},
                                       suffix)

    # ------------------------------------------------------------ checkpoint
    def _checkpoint(self, k, i_phase, j, stopped):
        if not self.state_dir:
            return
        c = self.central
        arrays = {"z": c.z, "y": c.y, "q": c.q, "b": np.asarray(c.b), **c.predictor_state()}
        if self.label_privacy_ is not None:   # the one label-DP draw: a resumed run reuses it
            arrays["t_label_dp"] = self.t
        arrays.update({f"s{m}": np.asarray(v) for m, v in self._last_s.items()})
        aa = None
        if self._acc is not None:
            aa_arrays, aa = self._acc.get_state()
            arrays.update(aa_arrays)
            arrays.update({f"aq{m}": q for m, q in enumerate(self._qs or [])})
        header = {"round": k, "phase": i_phase, "j": j, "phase_stopped": bool(stopped), "rho": c.rho,
                  "alpha": c.alpha, "theta": c.theta, "n": c.n, "num_parties": self.num_parties,
                  "loss": self.loss.name, "fit_intercept": bool(c.fit_intercept),
                  "private_parties": {str(m): t for m, t in self.private_parties.items()},
                  "node_to_party": {str(n): p for n, p in self.node_to_party.items()},
                  "stale": {str(m): v for m, v in self._stale.items()},
                  "history": self.history_, "privacy": self.privacy_, "anderson": aa,
                  "label_epsilon": self.label_epsilon}
        save_checkpoint(self.state_dir, arrays, to_jsonable(header))

    def _restore(self, folder):
        """Load a checkpoint; returns (round, phase, j, phase_stopped)."""
        arrays, h = load_checkpoint(folder)
        c = self.central
        mine = {"n": c.n, "num_parties": self.num_parties, "loss": self.loss.name, "alpha": c.alpha,
                "theta": c.theta, "fit_intercept": bool(c.fit_intercept),
                "private_parties": {str(m): t for m, t in self.private_parties.items()}}
        for key, value in mine.items():
            if h[key] != value:
                raise ValueError(f"resume={str(folder)!r}: the checkpoint has {key}={h[key]!r} but this run has "
                                 f"{value!r}; resume with the run's original configuration")
        c.z, c.y, c.q = arrays["z"], arrays["y"], arrays["q"]
        if h.get("label_epsilon") != self.label_epsilon:
            raise ValueError(f"resume={str(folder)!r}: the checkpoint has label-epsilon="
                             f"{h.get('label_epsilon') or 0!r} but this run has {self.label_epsilon or 0!r}; "
                             "resume with the run's original label-epsilon")
        if "t_label_dp" in arrays:     # the checkpointed privatized labels, not a second draw
            self.t = c.t = arrays["t_label_dp"]
        c.b = np.float64(arrays["b"][()]) if arrays["b"].ndim == 0 else arrays["b"]
        c.set_rho(h["rho"])
        c.set_predictor_state(arrays)      # the z-update's warm-start predictor (core/central.py)
        self._last_s = {int(k[1:]): v for k, v in arrays.items() if k[0] == "s" and k[1:].isdigit()}
        if self._acc is not None and h.get("anderson") is not None:
            self._acc.set_state(arrays, h["anderson"])
            qs = [arrays.get(f"aq{m}") for m in range(self.num_parties)]
            self._qs = None if any(q is None for q in qs) else qs
        self._stale = {int(m): v for m, v in h["stale"].items()}
        self.history_ = h["history"]
        self.privacy_ = {int(m): v for m, v in h["privacy"].items()}
        log(INFO, "resuming from %s after round %d", folder, h["round"])
        return h["round"], h["phase"], h["j"], h["phase_stopped"]

    # ------------------------------------------------------------------- loop
    def start(self, grid: Grid, timeout: float | None = None, progress=None):
        """Identify the parties, then run rounds until the stopping rule or ``max_rounds``.

        With private parties the rounds follow :func:`~flower_vfl.core.schedule.private_schedule`
        (as the in-process engine does): the non-private parties first, then the private
        parties' declared number of training rounds, then the final evaluation, in which the
        private parties make their last, unreleased x-update.

        A party's refusal (budget spent) stops the run cleanly: ``stopped_reason_`` says why
        and the rounds done so far are kept. A party that fails, sends an invalid reply or does
        not come back within ``party_wait`` stops the run with the checkpoint of the last full
        round: ``stopped_reason_`` names the party and ``failed_`` is True; the error is raised
        again so that the ServerApp (and the Flower run) fail.
        """
        if timeout is not None:
            self.round_timeout = timeout
        t0 = time.perf_counter()
        self.summary()
        self.identify(grid)
        self._last_s: dict[int, np.ndarray] = {}
        self._stale: dict[int, int] = {}
        self._acc = make_accelerator(self.acceleration, self.central,
                                     [self.stragglers == "stale", bool(self.private_parties)],
                                     self.penalty, self.constraint is not None,
                                     n_parties=self.num_parties)
        self.acceleration_ = acceleration_name(self._acc)
        self._qs = None
        k, phase0, j0, stopped0 = 0, 0, 0, False
        if self.resume:
            k, phase0, j0, stopped0 = self._restore(self.resume)
        private = [m in self.private_parties for m in range(self.num_parties)]
        phases = private_schedule(private, self.max_rounds, list(self.private_parties.values()))
        try:
            for i_phase, (n_rounds, active, use_tol) in enumerate(phases):
                if i_phase < phase0 or (i_phase == phase0 and stopped0):
                    continue
                parties = {m for m in range(self.num_parties) if active[m]}
                last_phase = i_phase == len(phases) - 1
                for j in range(j0 + 1 if i_phase == phase0 else 1, n_rounds + 1):
                    k += 1
                    self._train_round(grid, k, parties)
                    self.history_[-1].update(parties=len(parties), elapsed_s=time.perf_counter() - t0)
                    r, d, s_sum = self._last
                    eps_pri, eps_dual = residuals(r, d, s_sum, self.central.z, self.central.y, self.tol,
                                                  self.tol_abs)
                    stop = use_tol and self.tol > 0 and r <= eps_pri and d <= eps_dual
                    if self._acc is not None and not stop:   # the engine's call (core/accel.py)
                        self._qs = self._acc.step([self._last_s[m] for m in range(self.num_parties)],
                                                  self.central)
                    done = last_phase and (j == n_rounds or stop)
                    if self.t_test is not None and not done and self.eval_every and k % self.eval_every == 0:
                        self._evaluate(grid, k)
                    self._checkpoint(k, i_phase, j, stop)
                    if progress is not None:
                        progress(k, self.history_[-1])
                    if stop:
                        break
                if i_phase == 0 and self.private_parties and self.t_test is not None:
                    # the non-private parties alone, at the end of the warm start: the bar the
                    # private parties must clear (a warning after the run if they do not)
                    self.nonprivate_reference_ = dict(self._evaluate(grid, k))
            if self.t_test is not None:
                self._evaluate(grid, k, final=True)
                self._warn_if_dp_hurts()
        except PartyRefused as exc:
            self.stopped_reason_ = str(exc)
            log(WARNING, "stopping: %s", exc)
        except (PartyLost, PartyFailed, ReplyError, PermissionError) as exc:
            self.stopped_reason_, self.failed_ = str(exc), True
            log(ERROR, "stopping after round %d (checkpoint: %s): %s", len(self.history_),
                self.state_dir or "none, set state-dir or out-dir", exc)
            self._finish(k, t0)
            raise
        return self._finish(k, t0)

    def protection(self) -> dict:
        """What this run protects, per party (the run report's plain statement)."""
        label_eps = getattr(self, "label_epsilon", None)
        labels = (f"label DP: randomized response at epsilon_label={label_eps:g}, before training"
                  if label_eps else "not protected: sign(y) reveals every training label to every party")
        out = {}
        for m in range(self.num_parties):
            rep = self.privacy_.get(m) or self.privacy_.get(str(m))
            feats = (f"row-level DP of this party's training rows (budget epsilon={rep['config']['epsilon']:g}, "
                     f"delta={rep['config']['delta']:g}; spent {rep['totals'].get('exact', float('nan')):.4g} "
                     "by its own ledger)" if rep else
                     "not protected: exact D_m x_m released every round")
            out[str(m)] = {"features": feats, "labels": labels,
                           "scored_rows": "not protected: the scores of test/prediction rows are released"}
        return out

    def _warn_if_dp_hurts(self):
        ref = getattr(self, "nonprivate_reference_", None)
        final = self.history_[-1].get("test_loss") if self.history_ else None
        if ref and final is not None and final > ref["test_loss_nonprivate"]:
            self.dp_warning_ = (
                f"the private parties made the model worse: test loss {final:.4g} with them vs "
                f"{ref['test_loss_nonprivate']:.4g} for the non-private parties alone. Their noise "
                "outweighs their columns at these settings: raise the private parties' dp-lam (node "
                "config), lower their dp-train-rounds, or give them a larger dp-epsilon")
            log(WARNING, "%s", self.dp_warning_)

    def _finish(self, k, t0):
        self.final_ = dict(self.history_[-1]) if self.history_ else {}
        self.final_["rounds"] = len(self.history_)
        self.final_["wall_time_s"] = time.perf_counter() - t0
        self.final_["intercept"] = np.asarray(self.central.b).tolist()
        if getattr(self, "dp_warning_", None):
            self.final_["dp_warning"] = self.dp_warning_
        self.final_["protection"] = self.protection()
        if self.stopped_reason_:
            self.final_["stopped_reason"] = self.stopped_reason_
        if self.failed_:
            self.final_["failed"] = True
        return self
