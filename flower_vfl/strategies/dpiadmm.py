"""The server of horizontal DP inexact ADMM (Ryu & Kim; OutP: Huang et al. 2019) as a
Flower message-API strategy.

The server holds w, every agent's dual lambda_p (recomputed from the released z_p, eq. 4c:
no privacy cost) and the rho schedule (eq. 21). Round t: w^{t+1} from eq. (4a) goes to
every agent with t and rho_t; each agent replies with its z_p^{t+1} (objective-perturbed
for ObjP/ObjT, output-perturbed for OutP) and the server updates lambda_p. The math is
:mod:`flower_vfl.horizontal.admm`, the same functions the in-process engine calls; agents are
identified and replies matched by :mod:`.exchange`, as on every central-node path; Flower's
``start`` contract, identify and the Result are :class:`~flower_vfl.strategies.base.CentralBase`'s,
the run's w, z_p, lambda_p and rho_t its state (:class:`DPIADMMState`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from functools import partial
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.core.rounds import eval_due, run_rounds
from flower_vfl.errors import UserError
from flower_vfl.horizontal.admm import DPIADMMParams, dual_step, rho_schedule, server_step
from flower_vfl.horizontal.model import error_rate
from flower_vfl.config.schema import DPIADMM_PARAMS, check_params
from flower_vfl.strategies.base import CentralBase, RunState, check_num_rounds
from flower_vfl.strategies.config import build_config
from flower_vfl.strategies.exchange import ReplyError, identity_record

__all__ = ["DPIADMMStrategy", "DPIADMMConfig", "DPIADMMState", "AgentRefused"]


class AgentRefused(UserError, RuntimeError):
    """An agent refused to answer (its privacy budget is spent, or a replay it rejects)."""


@dataclasses.dataclass
class DPIADMMState(RunState):
    """A DP-IADMM run: the server's w, every agent's z_p and lambda_p, this round's rho_t, the
    agents' sample counts and the settings with their eps_bar (learnt at identify)."""

    w: np.ndarray | None = None
    Z: np.ndarray | None = None
    Lam: np.ndarray | None = None
    rho: float | None = None
    n_samples: dict = dataclasses.field(default_factory=dict)
    params: DPIADMMParams | None = None


@dataclasses.dataclass(frozen=True)
class DPIADMMConfig:
    """Settings of the DP-IADMM server, checked by the parameter table
    (:data:`flower_vfl.config.schema.DPIADMM_PARAMS`: the horizontal run config's ``hz-*`` keys'
    types, ranges and defaults where one sets it) when the object is made.

    Parameters
    ----------
    variant : {'objp', 'objt', 'outp'}, default='objt'
    num_agents : int, default=10
    num_features, num_classes : int, default=784, 10
        J and K of the multiclass logistic regression.
    num_iterations : int, default=100
        T.
    a, beta, box, c1, c2, Tc, rho_max, trust : see :class:`flower_vfl.horizontal.DPIADMMParams`
        The public algorithm settings sent to every agent. The privacy settings (eps_bar,
        delta_bar, sensitivity, seed) are the agents' own (their node config); the server
        learns only eps_bar (for rho_t, eq. 21) from the identify reply.
    eval_every : int >= 1, default=10
    timeout : float > 0, default=600
    party_wait : float >= 0, default=0
        Seconds to wait for a missing agent (at identify, and for a lost node to come back), as
        :class:`~flower_vfl.strategies.exchange.Exchange`.
    """

    variant: str = "objt"
    num_agents: int = 10
    num_features: int = 784
    num_classes: int = 10
    num_iterations: int = 100
    # the paper's schedule constants: the agents' DPIADMMParams defaults (one place)
    a: float = DPIADMMParams.a
    beta: float = DPIADMMParams.beta
    box: float = DPIADMMParams.box
    c1: float = DPIADMMParams.c1
    c2: float = DPIADMMParams.c2
    Tc: float = DPIADMMParams.Tc
    rho_max: float = DPIADMMParams.rho_max
    trust: str = "paper"
    eval_every: int = 10
    timeout: float = 600.0
    party_wait: float = 0.0

    OWNER, EXAMPLE = "DPIADMMStrategy", "DPIADMMConfig(variant='objt', num_agents=4, num_iterations=50)"
    #: the former positional arguments, in their order
    POSITIONAL = ("variant", "num_agents", "num_features", "num_classes", "num_iterations", "a", "beta", "box",
                  "c1", "c2", "Tc", "rho_max", "trust")

    def __post_init__(self):
        checked = check_params(self.OWNER, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                               DPIADMM_PARAMS)
        for name, value in checked.items():          # typed as the table says
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, config=None, *args, **settings) -> "DPIADMMConfig":
        """``config`` (or the defaults) with ``settings`` over it; or, as before the config object,
        the settings by position (``config`` the variant, ``args`` the rest, in :attr:`POSITIONAL`'s order)."""
        return build_config(cls, config, settings, args)

    @classmethod
    def from_run_config(cls, g: dict, **settings) -> "DPIADMMConfig":
        """From a horizontal run config checked by
        :func:`~flower_vfl.config.schema.parse_horizontal_run_config` (``settings``: what it does
        not hold, e.g. ``num_features``)."""
        base = dict(variant=g["hz-variant"], num_agents=g["hz-num-agents"], num_iterations=g["hz-iterations"],
                    a=g["hz-a"], beta=g["hz-beta"], trust=g["hz-trust"], eval_every=g["hz-eval-every"])
        return cls(**{**base, **settings})

    def public(self) -> DPIADMMParams:
        """The public algorithm settings sent to every agent."""
        return DPIADMMParams(variant=self.variant, a=self.a, beta=self.beta, box=self.box, c1=self.c1, c2=self.c2,
                             Tc=self.Tc, rho_max=self.rho_max, trust=self.trust).validate()


class DPIADMMStrategy(CentralBase):
    """Server of DP inexact ADMM over P agents holding different samples (same features).

    Parameters
    ----------
    config : DPIADMMConfig, optional
        The settings (:class:`DPIADMMConfig`), checked by the parameter table when made. As before
        the config object, the settings may also be given by position, ``DPIADMMStrategy(variant,
        num_agents, num_features, num_classes, num_iterations, ...)``.
    X_test, y_test : arrays, optional
        Held-out data for the test error of w (the server's own data, never sent).
    progress : callable, optional
        ``progress(t, row)`` after each round (also settable as the attribute ``progress``).
    **settings :
        The settings by name (``num_agents=4``, ``beta=1e-4``, ...), over ``config``; a name that is
        not a field of DPIADMMConfig is refused naming the closest one.

    After :meth:`start`: ``state_`` (:class:`DPIADMMState`) and its read-outs ``history_``,
    ``final_``, ``privacy_``, ``stopped_reason_``, ``w``, ``Z``, ``Lam``, ``params``, ``n_samples``.
    """

    State = DPIADMMState
    ROLE, COUNT_KEY = "agent", "hz-num-agents"
    HALTS = (AgentRefused,)

    def __init__(self, config: DPIADMMConfig | None = None, *args, X_test=None, y_test=None, progress=None,
                 **settings):
        # every setting checked by the parameter table (config/schema.py, DPIADMM_PARAMS) before any work
        self.config = cfg = DPIADMMConfig.build(config, *args, **settings)
        self.public = cfg.public()
        self.num_agents, self.J, self.K = cfg.num_agents, cfg.num_features, cfg.num_classes
        self.num_parties = self.num_agents
        self.T = cfg.num_iterations
        self.X_test, self.y_test, self.eval_every, self.timeout = X_test, y_test, cfg.eval_every, cfg.timeout
        self.party_wait = cfg.party_wait
        self.progress = progress
        super().__init__()

    # ------------------------------------------------------------ read-outs of the last run
    @property
    def w(self):
        return self.state_.w

    @property
    def Z(self):
        return self.state_.Z

    @property
    def Lam(self):
        return self.state_.Lam

    @property
    def params(self) -> DPIADMMParams | None:
        return self.state_.params

    @property
    def n_samples(self) -> dict:
        return self.state_.n_samples

    @property
    def node_to_agent(self) -> dict[int, int]:
        return self.node_to_party

    def summary(self) -> None:
        p = self.public
        log(INFO, "\t├── DPIADMMStrategy: variant=%s, %d agents, T=%d", p.variant, self.num_agents, self.T)
        log(INFO, "\t└── a=%g beta=%g box=%g rho: c1=%g c2=%g Tc=%g", p.a, p.beta, p.box, p.c1, p.c2, p.Tc)

    # ------------------------------------------------------------ handshake
    def read_identity(self, nid, rep):
        info = identity_record(nid, rep)
        agent = int(info["agent"])
        if int(info["num_features"]) != self.J:
            raise ValueError(f"agent {agent} has {info['num_features']} features, the server expects "
                             f"num_features={self.J}")
        return agent, (int(info["n_samples"]), None if float(info["eps_bar"]) <= 0 else float(info["eps_bar"]))

    def identify(self, grid: Grid, state: DPIADMMState) -> DPIADMMState:
        """Map node id -> agent; learn I_p and each agent's eps_bar (for eq. 21)."""
        state = super().identify(grid, state)
        state.n_samples = {a: n for a, (n, _) in state.identity.items()}
        eps = {a: e for a, (_, e) in state.identity.items()}
        if len(set(eps.values())) != 1:
            raise ValueError(f"the agents' eps_bar differ ({eps}); rho_t (eq. 21) needs one eps_bar: "
                             "configure the same dp-eps-bar on every agent")
        state.params = DPIADMMParams(**{**self.public.__dict__, "eps_bar": next(iter(eps.values()))}).validate()
        return state

    # ------------------------------------------------------------ a round
    def round_messages(self, state: DPIADMMState, t: int) -> tuple[DPIADMMState, list[Message]]:
        """Round t: w^{t+1} (eq. 4a) and rho_t to every agent."""
        p = state.params
        state.rho = rho_schedule(t, p)
        state.w = server_step(state.Z, state.Lam, state.rho)
        cfg = {"t": t, "rho": state.rho, "variant": p.variant, "a": p.a, "beta": p.beta, "box": p.box,
               "trust": p.trust, "I": int(sum(state.n_samples.values())), "P": self.num_agents,
               "final": t == self.last_round(state)}
        content = RecordDict({"arrays": ArrayRecord({"w": Array(state.w)}), "config": ConfigRecord(cfg)})
        n2a = state.exchange.node_to_party
        return state, [Message(content, dst_node_id=nid, message_type="train") for nid in sorted(n2a, key=n2a.get)]

    def aggregate(self, state: DPIADMMState, t: int, replies: Iterable[Message]) -> DPIADMMState:
        """Collect every z_p^{t+1}; lambda_p += rho_t (w^{t+1} - z_p^{t+1}) (eq. 4c). ``replies``:
        the agents' reply Messages, matched to agents by the exchange (reply_to_message_id). The
        round's row, with the test error where due (:meth:`test_error`), goes to the history."""
        row = self.aggregate_row(state, t, replies)
        if self.X_test is not None and eval_due(t, self.last_round(state), max(self.eval_every, 1)):
            self.test_error(state, t, row)
        state.history.append(row)
        return state

    def last_round(self, state: DPIADMMState) -> int:
        """T of the run: ``start``'s ``num_rounds``, else ``num_iterations``."""
        return self.T if state.num_rounds is None else int(state.num_rounds)

    def test_error(self, state: DPIADMMState, t: int, row: dict) -> None:
        """The test error of w^{t+1} on the server's held-out data, into round t's ``row``."""
        row["test_error"] = float(error_rate(state.w, self.X_test, self.y_test))

    def aggregate_row(self, state: DPIADMMState, t: int, replies: Iterable[Message]) -> dict:
        """:meth:`aggregate`'s step (state updated in place): round t's history row, before the test error."""
        got = {}
        for rep in replies:
            agent = state.exchange.party_of(rep)
            if "refusal" in rep.content:
                raise AgentRefused(f"agent {agent} refused: {rep.content['refusal']['reason']}")
            if "privacy" in rep.content:
                state.privacy[agent] = json.loads(str(rep.content["privacy"]["report"]))
            z = rep.content["release"]["z"].numpy()
            if z.shape != (self.J, self.K) or not np.all(np.isfinite(z)):
                raise ValueError(f"agent {agent} sent z of shape {z.shape} (finite: {np.all(np.isfinite(z))}); "
                                 f"expected finite ({self.J}, {self.K})")
            got[agent] = z
        missing = sorted(set(range(self.num_agents)) - set(got))
        if missing:
            raise ReplyError(f"round {t}: no reply of agents {missing} to aggregate")
        state.Z = np.stack([got[p] for p in range(self.num_agents)])
        state.Lam = dual_step(state.Lam, state.w, state.Z, state.rho)
        return {"t": int(t), "rho": state.rho, "consensus_violation": float(np.abs(state.w[None] - state.Z).sum())}

    # ------------------------------------------------------------ Flower's 4 hooks (on ``state_``)
    def configure_train(self, server_round, arrays, config, grid) -> Iterable[Message]:
        """Round t: w^{t+1} (eq. 4a) and rho_t to every agent."""
        return self.round_messages(self.state_, int(server_round))[1]

    def aggregate_train(self, server_round, replies):
        """Every z_p^{t+1} and the dual step; the round's history row as metrics (no model sent back)."""
        state = self.aggregate(self.state_, int(server_round), replies)
        return None, MetricRecord({k: float(v) for k, v in state.history[-1].items()})

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []              # the server evaluates w on its own held-out data

    def aggregate_evaluate(self, server_round, replies):
        return None

    # ------------------------------------------------------------------ loop
    def check_start(self, initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn):
        """Flower's start() arguments: refused, naming the fix, when DP-IADMM cannot honour them;
        the initial w (or None).

        ``initial_arrays``: empty (w^1 from z_p^0 = 0, as the paper), or ``{"w": (J, K)}``, the
        first w sent to the agents (the server's copy of every z_p^0 starts there, so w^1 = w; the
        agents' own z_p^0 stay 0); ``train_config`` / ``evaluate_config`` empty (an agent takes
        only the protocol's t, rho_t and the public settings); ``evaluate_fn(t, ArrayRecord({"w"}))``:
        Flower's central evaluation of w after each round, its metrics in the Result's
        ``evaluate_metrics_serverapp``. ``num_rounds``: None = ``num_iterations``."""
        check_num_rounds(num_rounds, "iterations T")
        for name, cfg in (("train_config", train_config), ("evaluate_config", evaluate_config)):
            if cfg is not None and len(cfg):
                raise ValueError(f"{name} holds {sorted(cfg.keys())}; an agent takes only the protocol's t, rho_t "
                                 "and the strategy's public settings (a, beta, box, trust): pass None")
        if initial_arrays is None or not len(initial_arrays):
            return None
        if set(initial_arrays.keys()) != {"w"}:
            raise ValueError(f"initial_arrays holds {sorted(initial_arrays.keys())}; give ArrayRecord() or one "
                             f"array 'w' of shape ({self.J}, {self.K})")
        w = initial_arrays["w"].numpy()
        if w.shape != (self.J, self.K) or not np.all(np.isfinite(w)):
            raise ValueError(f"initial_arrays['w'] has shape {w.shape}; expected finite ({self.J}, {self.K})")
        return np.asarray(w, dtype=float)

    def train_round(self, state: DPIADMMState, t: int) -> dict:
        """Round t: w^{t+1} and rho_t out (:meth:`round_messages`), every z_p^{t+1} back
        (:meth:`aggregate_row`); the round's history row."""
        state, messages = self.round_messages(state, t)
        got = state.exchange.send_messages(messages, f"round {t} (train)")
        return self.aggregate_row(state, t, got.values())

    def run(self, grid: Grid, state: DPIADMMState) -> DPIADMMState:
        """``num_rounds`` rounds (None: ``num_iterations``) in the one round loop
        (:func:`~flower_vfl.core.rounds.run_rounds`): :meth:`train_round`, the test error every
        ``eval_every`` rounds and after the last, Flower's central evaluation (``evaluate_fn``)
        after each; an agent's refusal ends the run cleanly (:attr:`HALTS`: the Result holds the
        rounds done)."""
        w0 = state.initial
        state.Z = np.zeros((self.num_agents, self.J, self.K)) + (0.0 if w0 is None else w0[None])
        state.Lam = np.zeros_like(state.Z)

        def on_round(t, row, stop):
            self.evaluate_central(state, t, ArrayRecord({"w": Array(state.w)}))
            self.progress_row(t, row)

        run_rounds(lambda t: (self.train_round(state, t), False), self.last_round(state), history=state.history,
                   evaluate=None if self.X_test is None else partial(self.test_error, state),
                   eval_every=max(self.eval_every, 1), on_round=on_round)
        return state

    def model(self, state: DPIADMMState) -> dict | None:
        """The final w (none before a round ran)."""
        return {"w": state.w} if state.history else None

    def round_metrics(self, state: DPIADMMState) -> tuple[dict, dict]:
        return {int(row["t"]): {k: float(v) for k, v in row.items()} for row in state.history}, {}
