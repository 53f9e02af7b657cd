"""The server of horizontal DP inexact ADMM (Ryu & Kim; OutP: Huang et al. 2019) as a
Flower message-API strategy.

The server holds w, every agent's dual lambda_p (recomputed from the released z_p, eq. 4c:
no privacy cost) and the rho schedule (eq. 21). Round t: w^{t+1} from eq. (4a) goes to
every agent with t and rho_t; each agent replies with its z_p^{t+1} (objective-perturbed
for ObjP/ObjT, output-perturbed for OutP) and the server updates lambda_p. The math is
:mod:`flower_vfl.horizontal.admm`, the same functions the in-process engine calls; agents are
identified and replies matched by :mod:`.exchange`, as on every central-node path.
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
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl.errors import UserError
from flower_vfl.horizontal.admm import DPIADMMParams, dual_step, rho_schedule, server_step
from flower_vfl.horizontal.model import error_rate
from flower_vfl.strategies.exchange import Exchange, ReplyError, identity_record

__all__ = ["DPIADMMStrategy", "AgentRefused"]


class AgentRefused(UserError, RuntimeError):
    """An agent refused to answer (its privacy budget is spent, or a replay it rejects)."""


class DPIADMMStrategy(Strategy):
    """Server of DP inexact ADMM over P agents holding different samples (same features).

    Parameters
    ----------
    variant : {'objp', 'objt', 'outp'}, default='objt'
    num_agents : int
    num_features, num_classes : int
        J and K of the multiclass logistic regression.
    num_iterations : int, default=100
        T.
    a, beta, box, c1, c2, Tc, rho_max, trust : see :class:`flower_vfl.horizontal.DPIADMMParams`
        The public algorithm settings sent to every agent. The privacy settings (eps_bar,
        delta_bar, sensitivity, seed) are the agents' own (their node config); the server
        learns only eps_bar (for rho_t, eq. 21) from the identify reply.
    X_test, y_test : arrays, optional
        Held-out data for the test error of w (the server's own data, never sent).
    eval_every : int, default=10
    timeout : float, default=600
    party_wait : float, default=0
        Seconds to wait for a missing agent (at identify, and for a lost node to come back), as
        :class:`~flower_vfl.strategies.exchange.Exchange`.
    progress : callable, optional
        ``progress(t, row)`` after each round (also settable as the attribute ``progress``).
    """

    def __init__(self, variant="objt", num_agents=10, num_features=784, num_classes=10, num_iterations=100,
                 a=1.0, beta=1e-6, box=1.0, c1=2.0, c2=5.0, Tc=1e4, rho_max=1e9, trust="paper",
                 X_test=None, y_test=None, eval_every=10, timeout=600.0, party_wait=0.0, progress=None):
        self.public = DPIADMMParams(variant=variant, a=a, beta=beta, box=box, c1=c1, c2=c2, Tc=Tc,
                                    rho_max=rho_max, trust=trust).validate()
        if int(num_agents) < 1 or int(num_iterations) < 1:
            raise ValueError(f"num_agents={num_agents!r}, num_iterations={num_iterations!r}; both must be >= 1")
        self.num_agents, self.J, self.K = int(num_agents), int(num_features), int(num_classes)
        self.T = int(num_iterations)
        self.X_test, self.y_test, self.eval_every, self.timeout = X_test, y_test, int(eval_every), timeout
        self.party_wait = float(party_wait)
        self.exchange: Exchange | None = None
        self.n_samples: dict[int, int] = {}
        self.params: DPIADMMParams | None = None
        self.history_: list[dict] = []
        self.privacy_: dict[int, dict] = {}
        self.stopped_reason_: str | None = None
        self.progress = progress

    def summary(self) -> None:
        p = self.public
        log(INFO, "\t├── DPIADMMStrategy: variant=%s, %d agents, T=%d", p.variant, self.num_agents, self.T)
        log(INFO, "\t└── a=%g beta=%g box=%g rho: c1=%g c2=%g Tc=%g", p.a, p.beta, p.box, p.c1, p.c2, p.Tc)

    # ------------------------------------------------------------ handshake
    @property
    def node_to_agent(self) -> dict[int, int]:
        return {} if self.exchange is None else self.exchange.node_to_party

    def _read_identity(self, nid, rep):
        info = identity_record(nid, rep)
        agent = int(info["agent"])
        if int(info["num_features"]) != self.J:
            raise ValueError(f"agent {agent} has {info['num_features']} features, the server expects "
                             f"num_features={self.J}")
        return agent, (int(info["n_samples"]), None if float(info["eps_bar"]) <= 0 else float(info["eps_bar"]))

    def identify(self, grid: Grid) -> dict[int, int]:
        """Map node id -> agent; learn I_p and each agent's eps_bar (for eq. 21)."""
        self.exchange = Exchange(grid, self.num_agents, role="agent", count_key="hz-num-agents",
                                 timeout=self.timeout, party_wait=self.party_wait)
        infos = self.exchange.identify("query.identify", RecordDict({"config": ConfigRecord({"want": "agent"})}),
                                       self._read_identity)
        self.n_samples = {a: n for a, (n, _) in infos.items()}
        eps = {a: e for a, (_, e) in infos.items()}
        if len(set(eps.values())) != 1:
            raise ValueError(f"the agents' eps_bar differ ({eps}); rho_t (eq. 21) needs one eps_bar: "
                             "configure the same dp-eps-bar on every agent")
        self.params = DPIADMMParams(**{**self.public.__dict__, "eps_bar": next(iter(eps.values()))}).validate()
        return self.node_to_agent

    # ------------------------------------------------------------ the hooks
    def configure_train(self, server_round, arrays, config, grid) -> Iterable[Message]:
        """Round t: w^{t+1} (eq. 4a) and rho_t to every agent."""
        t, p = int(server_round), self.params
        self._rho = rho_schedule(t, p)
        self.w = server_step(self.Z, self.Lam, self._rho)
        cfg = {"t": t, "rho": self._rho, "variant": p.variant, "a": p.a, "beta": p.beta, "box": p.box,
               "trust": p.trust, "I": int(sum(self.n_samples.values())), "P": self.num_agents,
               "final": t == self.T}
        content = RecordDict({"arrays": ArrayRecord({"w": Array(self.w)}), "config": ConfigRecord(cfg)})
        order = sorted(self.node_to_agent, key=self.node_to_agent.get)
        return [Message(content, dst_node_id=nid, message_type="train") for nid in order]

    def aggregate_train(self, server_round, replies):
        """Collect every z_p^{t+1}; lambda_p += rho_t (w^{t+1} - z_p^{t+1}) (eq. 4c). ``replies``:
        the agents' reply Messages, matched to agents by the exchange (reply_to_message_id)."""
        got = {}
        for rep in replies:
            agent = self.exchange.party_of(rep)
            if "refusal" in rep.content:
                raise AgentRefused(f"agent {agent} refused: {rep.content['refusal']['reason']}")
            if "privacy" in rep.content:
                self.privacy_[agent] = json.loads(str(rep.content["privacy"]["report"]))
            z = rep.content["release"]["z"].numpy()
            if z.shape != (self.J, self.K) or not np.all(np.isfinite(z)):
                raise ValueError(f"agent {agent} sent z of shape {z.shape} (finite: {np.all(np.isfinite(z))}); "
                                 f"expected finite ({self.J}, {self.K})")
            got[agent] = z
        missing = sorted(set(range(self.num_agents)) - set(got))
        if missing:
            raise ReplyError(f"round {server_round}: no reply of agents {missing} to aggregate")
        self.Z = np.stack([got[p] for p in range(self.num_agents)])
        self.Lam = dual_step(self.Lam, self.w, self.Z, self._rho)
        row = {"t": int(server_round), "rho": self._rho,
               "consensus_violation": float(np.abs(self.w[None] - self.Z).sum())}
        if self.X_test is not None and (server_round % max(self.eval_every, 1) == 0 or server_round == self.T):
            row["test_error"] = float(error_rate(self.w, self.X_test, self.y_test))
        self.history_.append(row)
        return None, MetricRecord({k: float(v) for k, v in row.items()})

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []              # the server evaluates w on its own held-out data

    def aggregate_evaluate(self, server_round, replies):
        return None

    # ------------------------------------------------------------------ loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Identify the agents, then run ``num_rounds`` rounds (None: ``num_iterations``; stops
        cleanly on an agent's refusal); Flower's ``Strategy.start`` contract.

        ``initial_arrays``: empty (w^1 from z_p^0 = 0, as the paper), or ``{"w": (J, K)}``, the
        first w sent to the agents (the server's copy of every z_p^0 starts there, so w^1 = w; the
        agents' own z_p^0 stay 0); ``train_config`` / ``evaluate_config`` empty (an agent takes
        only the protocol's t, rho_t and the public settings); ``evaluate_fn(t, ArrayRecord({"w"}))``:
        Flower's central evaluation of w after each round, its metrics in the Result's
        ``evaluate_metrics_serverapp``. ``timeout``: seconds per request (None: the constructor's).
        Returns Flower's ``Result``: ``arrays`` the final w; ``train_metrics_clientapp[t]`` round t's
        history row. ``history_``, ``final_``, ``privacy_`` and ``stopped_reason_`` are kept as before."""
        w0 = self._check_start(initial_arrays, num_rounds, train_config, evaluate_config)
        if num_rounds is not None:
            self.T = int(num_rounds)
        if timeout is not None:
            self.timeout = timeout
        t0 = time.perf_counter()
        self.summary()
        self.identify(grid)
        self.Z = np.zeros((self.num_agents, self.J, self.K)) + (0.0 if w0 is None else w0[None])
        self.Lam = np.zeros_like(self.Z)
        result = Result()
        try:
            for t in range(1, self.T + 1):
                got = self.exchange.send_messages(self.configure_train(t, None, None, grid), f"round {t} (train)")
                self.aggregate_train(t, got.values())
                row = self.history_[-1]
                result.train_metrics_clientapp[t] = MetricRecord({k: float(v) for k, v in row.items()})
                if evaluate_fn is not None:
                    res = evaluate_fn(t, ArrayRecord({"w": Array(self.w)}))
                    if res is not None:
                        result.evaluate_metrics_serverapp[t] = res
                if self.progress is not None:
                    self.progress(t, row)
        except AgentRefused as exc:
            self.stopped_reason_ = str(exc)
            log(WARNING, "stopping: %s", exc)
        self.final_ = {**(self.history_[-1] if self.history_ else {}), "rounds": len(self.history_),
                       "wall_time_s": time.perf_counter() - t0}
        if self.stopped_reason_:
            self.final_["stopped_reason"] = self.stopped_reason_
        if self.history_:
            result.arrays = ArrayRecord({"w": Array(self.w)})
        return result

    def _check_start(self, initial_arrays, num_rounds, train_config, evaluate_config):
        """Flower's start() arguments: refused, naming the fix, when DP-IADMM cannot honour them;
        the initial w (or None)."""
        if num_rounds is not None and (isinstance(num_rounds, bool) or not isinstance(num_rounds, int)
                                       or num_rounds < 1):
            raise ValueError(f"num_rounds={num_rounds!r}; expected an integer >= 1 (iterations T)")
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
