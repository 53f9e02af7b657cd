"""The round loop, written once, and the rounds of vertical ADMM sharing (Algorithm 1).

:func:`run_rounds` is every route's round loop: it counts the rounds, calls the route's step,
keeps the history row, evaluates when due, asks the stop rule and calls the per-round callback
(the ADMM routes through :class:`RoundDriver`'s phases, the vertical SGD and horizontal DP-IADMM
central nodes and the SGD route's in-process reference directly).

:class:`RoundDriver` runs the rounds of the in-process engine
(:class:`flower_vfl.estimator.engine.VerticalADMM`) and of the Flower central node
(:class:`flower_vfl.strategies.vertical_admm.VerticalADMMStrategy`): the phases of
:func:`~flower_vfl.core.schedule.private_schedule`, the central step (Alg. 1 lines 9-11), the
history row, Boyd's residual stopping rule, residual balancing (``adaptive_rho``), the
accelerator (:mod:`flower_vfl.core.accel`), evaluation every ``eval_every`` rounds and the
per-round callback. How the parties are reached is the caller's :class:`RoundExchange`: the
engine calls its party objects in process, the strategy sends Flower Messages.

Defaults (one set, for both paths and the run config ``max-rounds`` / ``tol``):
:data:`DEFAULT_MAX_ROUNDS` = 50 and :data:`DEFAULT_TOL` = 0 (every round runs: the number of
rounds, hence of releases, is fixed by the configuration, and a run is reproducible round for
round); set ``tol`` > 0 (e.g. 1e-6) for the residual rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

import numpy as np

from flower_vfl.core.accel import acceleration_name, make_accelerator
from flower_vfl.core.central import residuals
from flower_vfl.core.penalties import penalty_class
from flower_vfl.core.schedule import balance_rho, private_schedule

__all__ = ["DEFAULT_MAX_ROUNDS", "DEFAULT_TOL", "DEFAULT_TOL_ABS", "SUM", "RoundDriver", "RoundExchange", "run_rounds",
           "eval_due",
           "sum_releases", "alignment", "next_theta", "VARIANTS", "initial_theta", "STOP_RULES", "max_change"]

DEFAULT_MAX_ROUNDS = 50
DEFAULT_TOL = 0.0
DEFAULT_TOL_ABS = 1e-9
#: the key under which a :class:`RoundExchange` that reaches the parties through secure
#: aggregation returns the round's sum sum_m s_m (it holds no party's own s_m; every party of
#: the round is in the sum, so nothing is stale, and no per-party accelerator applies)
SUM = -1


def eval_due(k: int, last: int, every: int, at_end: bool | None = True, stopped: bool = False,
             start: int | None = None) -> bool:
    """Whether round ``k`` of a loop ending at round ``last`` is evaluated: every ``every`` rounds
    (``k % every == 0``; 0: never); at the ending round (``k == last``, or the round the stop rule
    ended, ``stopped``) as ``at_end`` says: True, evaluated; False, not (the caller evaluates after
    its own finish); None, like any other round; and at round ``start`` (a curve's first point)."""
    if (k == last or stopped) and at_end is not None:
        return at_end
    return k == start or (bool(every) and k % every == 0)


def run_rounds(step: Callable, last: int, *, first: int = 1, history: list | None = None,
               evaluate: Callable | None = None, eval_every: int = 0, at_end: bool | None = True,
               at_start: bool = False, on_round: Callable | None = None) -> tuple[int, bool]:
    """The round loop: rounds ``first`` .. ``last`` (``first`` > 1: a resumed run), each

    1. ``row, stop = step(k)``: the route's round k, its history row and the stop rule's answer;
    2. ``history.append(row)`` (``history`` None: the route keeps its rows);
    3. ``evaluate(k, row)`` when :func:`eval_due`: every ``eval_every`` rounds, at the ending round
       as ``at_end`` says, after round ``first`` too with ``at_start``; the metrics go into ``row``;
    4. ``on_round(k, row, stop)`` (progress, checkpoint);

    until ``last`` or the first round whose ``stop`` is True. Returns ``(k, stopped)``: the last
    round run (``first - 1`` when none ran) and whether the stop rule ended the loop."""
    start = first if at_start else None
    k = first - 1
    for k in range(first, last + 1):
        row, stop = step(k)
        if history is not None:
            history.append(row)
        if evaluate is not None and eval_due(k, last, eval_every, at_end, stop, start):
            evaluate(k, row)
        if on_round is not None:
            on_round(k, row, stop)
        if stop:
            return k, True
    return k, False


class RoundExchange(Protocol):
    """How the driver reaches the parties."""

    #: True when there are test rows to score (the Flower central node with ``y_test``)
    evaluates: bool

    def train(self, k: int, parties: list[int], qs: list | None) -> tuple[dict, dict]:
        """Round ``k`` for ``parties`` (party m gets ``central.q``, or ``qs[m]`` when the
        accelerator set it): ``(releases, penalties)``, party -> s_m of the parties that
        answered and party -> lam R(x_m) of those that report it (non-private parties)."""

    def evaluate(self, k: int, parties: list[int], final: bool) -> dict:
        """Scores of the test rows by ``parties``; the metrics (``final``: after the private
        parties' last update)."""

    def finish(self, k: int) -> None:
        """After the last round, before the final evaluation."""


#: the parties' Jacobi damping theta: 'sharing' starts at Boyd's 1/M (Sec. 7.3) and, in plain
#: rounds, follows the releases' alignment (:meth:`RoundDriver.plan`); 'sharing-fixed' keeps 1/M;
#: 'paper' is eq. (6) verbatim (theta = 1)
VARIANTS = ("sharing", "sharing-fixed", "paper")


def initial_theta(variant: str, num_parties: int) -> float:
    """theta of round 1 for ``variant`` (:data:`VARIANTS`), or ValueError naming the choices."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; choose one of {', '.join(map(repr, VARIANTS))}")
    return 1.0 if variant == "paper" else 1.0 / num_parties


#: the releases' alignment (:func:`alignment`) is measured on every k-th row, k = N // ALIGN_ROWS
#: (at least 1): between ALIGN_ROWS and 2 ALIGN_ROWS rows, all of them below 2 ALIGN_ROWS
ALIGN_ROWS = 1 << 16


def alignment(new: dict, old: dict, num_parties: int) -> float | None:
    """R = ||sum_m ds_m||^2 / sum_m ||ds_m||^2 for the round's changes ds_m = new[m] - old[m] of
    every party's release (a party absent from ``old`` released 0 before), on every k-th row
    (:data:`ALIGN_ROWS`); None when nothing moved.

    R is the Rayleigh quotient, at the round's step dx, of the parties' joint Gram D^T D against
    its block diagonal: 1 when the parties' changes are orthogonal, M when they coincide. With
    theta, the parties' x-updates are proximal-Jacobi steps with the proximal term
    rho (1/theta - 1) ||D_m (x - x_m)||^2 (Deng et al. 2017), whose metric
    rho (sum_m ||ds_m||^2 / theta - ||sum_m ds_m||^2) is >= 0 along the step iff theta <= 1 / R."""
    n = next(iter(new.values())).shape[0]
    rows = slice(None, None, max(1, n // ALIGN_ROWS))
    total, each = None, 0.0
    for m in range(num_parties):
        d = np.array(new[m][rows], dtype=float).ravel()
        if m in old:
            d -= np.ravel(old[m][rows])
        each += _sq(d)
        total = d if total is None else np.add(total, d, out=total)
    if not each > 0.0:
        return None
    return _sq(total) / each


#: theta moves only by more than this factor (each new rho / theta refactorizes a Gram-path party's
#: block), and a value within it of 1/M is 1/M (three copies of one block: R = 3 to rounding)
THETA_STEP = 1.05


def next_theta(theta: float, r_max: float, num_parties: int, first: bool) -> float:
    """theta for the next round from the largest alignment seen (:func:`alignment`): 1 / r_max
    clipped to [1/M, 1]; the first time it may rise from 1/M, after that it only falls, and by more
    than :data:`THETA_STEP` (:meth:`RoundDriver.plan`)."""
    lo = 1.0 / num_parties
    target = min(1.0, 1.0 / r_max)
    if target <= lo * THETA_STEP:
        return lo
    return target if first or target < theta / THETA_STEP else theta


def _sq(v) -> float:
    """||v||^2 by einsum: OpenBLAS's 2-thread dot stalled on N-vectors under load (core/central.py)."""
    return float(np.einsum("i,i->", v, v))


#: the driver's stopping rules: 'residual', Boyd's primal/dual residual rule (Sec. 3.3.1; the ADMM
#: route, the engine); 'change', the largest change of a release or of the intercept between two
#: rounds (:func:`max_change`; the moment route's pool rounds, whose party keeps no iterate)
STOP_RULES = ("residual", "change")


def max_change(new: dict, old: dict, b_new, b_old) -> float:
    """max_m max |s_m^{k+1} - s_m^k| over the parties in ``new`` (a party absent from ``old``
    released 0 before) and max |b^{k+1} - b^k|: the measure of the stopping rule 'change'."""
    ds = max((float(np.max(np.abs(s - old[m]))) if m in old else float(np.max(np.abs(s))) for m, s in new.items()),
             default=0.0)
    return max(ds, float(np.max(np.abs(np.asarray(b_new) - b_old))))


def sum_releases(released: list, like: np.ndarray | None = None) -> np.ndarray:
    """sum_m s_m in one new array: s_0 + s_1, then in place (zeros like ``like`` when nothing
    was released: every party private, in the warm start)."""
    if not released:
        return np.zeros_like(like)
    s_sum = released[0] + (released[1] if len(released) > 1 else 0.0)
    for s in released[2:]:
        s_sum += s
    return s_sum


class RoundDriver:
    """Algorithm 1's rounds over a :class:`RoundExchange`.

    Parameters
    ----------
    central : :class:`~flower_vfl.core.central.CentralUpdate`
    num_parties : int
    max_rounds : int, default=50
        Rounds of the first phase (with private parties: the warm start of the others).
    tol, tol_abs : float, default=0.0, 1e-9
        Boyd's residual rule (Sec. 3.3.1); tol=0 runs every round.
    adaptive_rho : bool, default=False
        Residual balancing (Boyd Sec. 3.4.1) after every round that does not stop.
    eval_every : int, default=0
        Score the test rows every k rounds (0: only after the last round).
    stop : {'residual', 'change'}, default='residual'
        The stopping rule (:data:`STOP_RULES`) where ``tol`` > 0: 'residual' is Boyd's;
        'change' stops after a round k > 1 whose :func:`max_change` is below ``tol`` (the row
        then holds it as ``max_change``).

    Attributes
    ----------
    history : list of dict
        Per round: round, train_loss (on the released s_m: what the central node sees),
        objective (when every party reported lam R(x_m)), primal/dual residual, rho, parties,
        stale, elapsed_s, and the evaluation metrics of the rounds that had one.
    last_s : dict
        party -> its last release (a stale or idle party counts with it).
    converged : bool
    """

    def __init__(self, central, num_parties: int, *, max_rounds: int = DEFAULT_MAX_ROUNDS, tol: float = DEFAULT_TOL,
                 tol_abs: float = DEFAULT_TOL_ABS, adaptive_rho: bool = False, eval_every: int = 0,
                 stop: str = "residual"):
        if stop not in STOP_RULES:
            raise ValueError(f"stop={stop!r}; choose one of {', '.join(map(repr, STOP_RULES))}")
        self.stop = stop
        self.central, self.num_parties = central, int(num_parties)
        self.max_rounds, self.tol, self.tol_abs = int(max_rounds), float(tol), float(tol_abs)
        self.adaptive_rho, self.eval_every = bool(adaptive_rho), int(eval_every)
        self.history: list[dict] = []
        self.last_s: dict[int, np.ndarray] = {}
        self.penalties: dict[int, float] = {}
        self.private = [False] * self.num_parties
        self.phases = private_schedule(self.private, self.max_rounds, [])
        self.acc, self.qs, self.acceleration = None, None, "none"
        self.converged = False
        #: the Jacobi damping follows the releases (:meth:`plan`); the largest alignment seen, and
        #: whether theta was set from it yet
        self.adapt_theta, self.alignment_max, self.theta_set = False, 0.0, False

    def plan(self, private, private_train_rounds, acceleration="none", penalty="l2", constrained=False,
             stale=False, adapt_theta=True) -> list:
        """The phases (:func:`private_schedule`) and the accelerator (off with a private party
        or ``stale`` releases: :func:`~flower_vfl.core.accel.make_accelerator`).

        ``adapt_theta``: in plain rounds (no accelerator, or :class:`~flower_vfl.core.accel.Anderson`
        before its stall gate engages: ``engaged`` False, core/accel.py ``STALL_RATIO``; theta is
        frozen from the round it engages, as Anderson's fixed-point map needs) of the sharing variant (theta = 1/M,
        alpha = 1), penalty 'l2' without a constraint, with every party non-private and its own
        release seen (not under secure aggregation, no stale release), the damping theta of round
        k + 1 is clip(1 / max_{j <= k} R_j, 1/M, 1), R_j the alignment of round j's releases
        (:func:`alignment`; :func:`next_theta`): it rises from 1/M once, after round 1, and never
        rises again (the proximal weight only grows, as in Deng et al.'s adaptive Jacobi-proximal
        ADMM), moving by 5 % or more; parties whose changes coincide keep Boyd's 1/M. Off
        (theta = 1/M) otherwise."""
        self.private = [bool(p) for p in private]
        self.phases = private_schedule(self.private, self.max_rounds, list(private_train_rounds))
        self.acc = make_accelerator(acceleration, self.central, self.private + [bool(stale)], penalty,
                                    constrained, n_parties=self.num_parties)
        self.acceleration, self.qs = acceleration_name(self.acc), None
        c, M = self.central, self.num_parties
        # L2 without a constraint only: a new rho / theta costs a prox x-update (L1, elastic net, a
        # constraint) its cached support factorizations (a9a L1: 33 -> 32 rounds, +28 % CPU)
        self.adapt_theta = bool(adapt_theta and (self.acc is None or getattr(self.acc, "engaged", True) is False)
                                and not any(self.private) and not stale
                                and M >= 2 and c.alpha == 1.0 and c.theta == 1.0 / M
                                and bool(getattr(penalty_class(penalty), "smooth_quadratic", False))
                                and not constrained)
        return self.phases

    def run(self, exchange: RoundExchange, *, start=(0, 0, 0, False), t0: float | None = None,
            on_round: Callable | None = None, on_warm_start: Callable | None = None) -> int:
        """Run the phases; returns the number of rounds done.

        ``start``: (round, phase, round in phase, phase stopped) of a resumed run.
        ``on_round(k, row, phase, j, stopped)`` after every round (checkpoint, callback);
        ``on_warm_start(k, metrics)`` at the end of the warm start of a run with private parties
        (``metrics``: the non-private parties' test scores, or None)."""
        t0 = time.perf_counter() if t0 is None else t0
        k, phase0, j0, stopped0 = start
        everyone = list(range(self.num_parties))
        evaluate = (lambda kk, row: self._evaluate(exchange, kk, final=False)) if exchange.evaluates else None
        for i_phase, (n_rounds, active, use_tol) in enumerate(self.phases):
            if i_phase < phase0 or (i_phase == phase0 and stopped0):
                continue
            parties = [m for m in everyone if active[m]]
            offset = k - (j0 if i_phase == phase0 else 0)          # round j of the phase is round offset + j
            # the last phase's ending round is evaluated after exchange.finish (final=True), below
            at_end = False if i_phase == len(self.phases) - 1 else None
            each = None if on_round is None else partial(_phase_round, on_round, i_phase, offset)
            k, stop = run_rounds(partial(self._round, exchange, parties=parties, use_tol=use_tol, t0=t0),
                                 offset + n_rounds, first=k + 1, history=self.history, evaluate=evaluate,
                                 eval_every=self.eval_every, at_end=at_end, on_round=each)
            if stop:
                self.converged = True
            if i_phase == 0 and any(self.private):
                metrics = self._evaluate(exchange, k, final=False) if exchange.evaluates else None
                if on_warm_start is not None:
                    on_warm_start(k, metrics)
        exchange.finish(k)
        if exchange.evaluates:
            self._evaluate(exchange, k, final=True)
        return k

    def _round(self, exchange, k, parties, use_tol, t0) -> tuple[dict, bool]:
        """One round: releases, central step (Alg. 1 lines 9-11), history row, stopping rule,
        then (if it goes on) residual balancing and the accelerator. ``(row, stop)``: the round's
        history row (:func:`run_rounds` keeps it) and whether the rule holds."""
        c, M = self.central, self.num_parties
        fresh, penalties = exchange.train(k, parties, self.qs)
        if self.stop == "change":      # before the releases and the intercept move on
            if SUM in fresh:
                raise ValueError("stop='change' needs each party's release; under secure aggregation use 'residual'")
            s_old, b_old = dict(self.last_s), np.array(c.b, dtype=float)
        self.penalties.update(penalties)
        own = False                       # s_sum is this round's own array (the train loss may reuse it)
        if SUM in fresh:                  # secure aggregation: the sum of every party of the round
            s_sum, fresh = fresh[SUM], dict.fromkeys(parties)
        else:
            if self.adapt_theta and len(fresh) == M and not getattr(self.acc, "engaged", False):
                a = alignment(fresh, self.last_s, M)
                if a is not None:
                    self.alignment_max = max(self.alignment_max, a)
            self.last_s.update(fresh)
            s_sum = sum_releases([self.last_s[m] for m in range(M) if m in self.last_s], c.z)
            own = True
        r, d = c.step(s_sum)
        eps = None
        if self.stop != "change" and use_tol and self.tol > 0:   # the thresholds (3 N-vector norms)
            eps = residuals(r, d, s_sum, c.z, c.y, self.tol, self.tol_abs)   # only where the rule applies
        row = {"round": k, "train_loss": _train_loss(c, s_sum, own)}
        if len(self.penalties) == M:
            row["objective"] = row["train_loss"] + sum(self.penalties[m] for m in range(M))
        row.update(primal_residual=r, dual_residual=d, rho=c.rho, parties=len(parties),
                   stale=len(set(parties) - set(fresh)), elapsed_s=time.perf_counter() - t0)
        if self.stop == "change":
            row["max_change"] = max_change(fresh, s_old, c.b, b_old)
        stop = False
        if self.stop == "change":
            stop = bool(use_tol and self.tol > 0 and k > 1 and row["max_change"] < self.tol)
        elif eps is not None:
            stop = bool(r <= eps[0] and d <= eps[1])
        if not stop:
            if self.adapt_theta and self.alignment_max > 0.0 and not getattr(self.acc, "engaged", False):
                c.theta = next_theta(c.theta, self.alignment_max, M, first=not self.theta_set)
                self.theta_set = True
            if self.adaptive_rho:
                c.set_rho(balance_rho(c.rho, r, d, c.loss, c.n))
            if self.acc is not None:
                self.qs = self.acc.step([self.last_s[m] for m in range(M)], c)
        return row, stop

    def _evaluate(self, exchange, k, final) -> dict:
        """Before the final update a private party is not asked (it releases its model once, at
        the end): the metrics are then the non-private parties' alone."""
        ask = list(range(self.num_parties)) if final else [m for m in range(self.num_parties) if not self.private[m]]
        out = dict(exchange.evaluate(k, ask, final))
        if self.history:
            self.history[-1].update(out)
        return out


#: the train loss works in the round's own sum of the releases from this many entries (128 KB)
INPLACE_MIN = 1 << 14


def _train_loss(c, s_sum, own) -> float:
    """The history row's train loss (1/N) sum l(s_sum + b) on the releases' sum. ``own``: s_sum is
    the round's own array, used by nothing after this row, so b is added in place and a loss that
    can (``mean_overwrites``: logistic) works in it too: no N-vector allocated, the same values
    (from :data:`INPLACE_MIN` entries: a smaller array comes from malloc's pools)."""
    loss = c.loss
    if not (own and getattr(loss, "mean_overwrites", False) and isinstance(s_sum, np.ndarray)
            and s_sum.size >= INPLACE_MIN and s_sum.dtype == np.float64 and s_sum.ndim == 1 and s_sum.flags.writeable
            and not any(np.may_share_memory(s_sum, a) for a in (c.z, c.y, c.q, c.t))):
        return loss.mean(s_sum + c.b, c.t)
    s_sum += c.b
    return loss.mean(s_sum, c.t, overwrite_z=True)


def _phase_round(on_round, i_phase, offset, k, row, stop) -> None:
    """:meth:`RoundDriver.run`'s ``on_round(k, row, phase, j, stopped)`` from :func:`run_rounds`'s."""
    on_round(k, row, i_phase, k - offset, stop)
