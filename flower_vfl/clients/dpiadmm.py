"""An agent of horizontal DP inexact ADMM as Flower message handlers (glue only: the math is
:mod:`flower_vfl.horizontal`, the ledger :mod:`flower_vfl.privacy.ledger`).

Trust boundary, the same rules as a vertical party's (docs/privacy.md, "Trust model"):

- the agent's privacy settings (``dp-eps-bar``, ``dp-delta-bar``, ``dp-sensitivity``,
  ``dp-x-l1-max``, ``dp-max-epsilon``, ``dp-delta``) come from its *node config* only; the
  server's messages carry public algorithm settings (t, rho_t, a, beta, box, ...) and w;
- a private agent has a node-level budget: ``dp-max-epsilon`` (at ``dp-delta``) is required;
- every release, Laplace (ObjP/ObjT) or Gaussian (OutP), is charged in the agent's one
  :class:`~flower_vfl.privacy.ledger.Ledger`, keyed by the data its node config declares
  (:func:`flower_vfl.clients.source.agent_source`), so a new ``hz-num-agents``, ``hz-split``,
  variant or run on the same samples composes there, in one privacy-loss distribution;
- the release is durable in the ledger before it is sent: a re-sent round gets the stored
  answer (no second draw), a restarted node resumes from its disk;
- the noise comes from OS entropy; an agent never has a seed (``dp-seed`` in its node config
  is refused). ``seed=`` exists on the class for in-process experiments that compare the
  Flower path with the engine draw for draw; a ClientApp never passes it.

The agent is a party like every other (:class:`~flower_vfl.clients.base.PartyBase`): identify's
skeleton, the one entry of every message (its fields parsed by the trust boundary's readers,
:mod:`flower_vfl.privacy.boundary`, before any math: a malformed one raises its
:class:`~flower_vfl.privacy.boundary.InvalidMessage`, which the ClientApp's ``reply_user_errors``
turns into an error reply) and the refusal reply (a replayed round, a spent budget).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.clients.base import PartyBase
from flower_vfl.config.schema import ConfigError
from flower_vfl.horizontal.admm import DPIADMMParams, agent_update, dual_step, outp_constants
from flower_vfl.horizontal.model import local_gradient_blocks, one_hot
from flower_vfl.horizontal.privacy import account, fresh_draw, ledger_entry, noise_multiplier, standard_draw
from flower_vfl.privacy.boundary import InvalidMessage, Refused, parse_count, parse_field, parse_flag, parse_scalar
from flower_vfl.privacy.ledger import Budget, BudgetExceeded, Ledger
from flower_vfl.privacy.store import PartyStore

__all__ = ["DPIADMMClient", "agent_privacy_from_node_config"]

STATE_ARRAYS, STATE_META = "hz.agent", "hz.meta"
#: the agents' ledger composes Laplace and Gaussian releases: one privacy-loss distribution
ACCOUNTANT = "pld"


def agent_privacy_from_node_config(nc) -> dict:
    """The agent's own privacy settings; ``dp-eps-bar`` absent or 0 means non-private.

    A private agent must set ``dp-max-epsilon`` (its budget over every release on its data, all
    runs); a ``dp-seed`` is refused (noise from a seed repeats across runs).
    """
    nc = dict(nc or {})
    party = nc.get("partition-id")
    if nc.get("dp-seed") not in (None, "", -1, "-1"):
        raise ConfigError(f"agent {party}: node config key 'dp-seed'={nc['dp-seed']!r} is refused: an agent draws "
                          "its noise from OS entropy only, since noise from a seed repeats in every run and two "
                          "runs' releases would cancel it (docs/privacy.md). Remove dp-seed")
    eps = float(nc.get("dp-eps-bar", 0) or 0)
    if eps < 0 or not math.isfinite(eps):
        raise ConfigError(f"agent {party}: node config dp-eps-bar={eps!r}; give a positive number (0: non-private)")
    cap = nc.get("dp-max-epsilon")
    cap = None if cap in (None, "") else float(cap)
    if eps > 0 and (cap is None or not (math.isfinite(cap) and cap > 0)):
        raise ConfigError(f"agent {party}: node config dp-eps-bar={eps:g} makes this agent private, and a private "
                          f"agent needs a budget over every release on its data: set 'dp-max-epsilon' (total ε "
                          f"at dp-delta, all runs and splits composed) to a positive number"
                          + ("" if cap is None else f" (got {cap!r})"))
    return {"eps_bar": eps if eps > 0 else None, "delta_bar": float(nc.get("dp-delta-bar", 1e-6)),
            "sensitivity": str(nc.get("dp-sensitivity", "replace")),
            "x_l1_max": float(nc["dp-x-l1-max"]) if "dp-x-l1-max" in nc else None,
            "delta": float(nc.get("dp-delta", 1e-5)), "max_epsilon": cap}


def bounded_rows(X, l1_max=None) -> np.ndarray:
    """A private agent's own rows inside the bounds its calibrations assume, enforced rather than
    hoped for (docs/reproduction-horizontal.md): features in [0, 1] (OutP's ||x||_2^2 <= ||x||_1 and
    'replace''s x' in [0, 1]^J) and, with ``dp-x-l1-max``, ||x||_1 <= it ('replace''s 4 x_l1_max / I,
    OutP's c1): a row above it is scaled onto it. Rows already inside come back bit for bit."""
    X = np.clip(np.asarray(X, dtype=float), 0.0, 1.0)
    if l1_max is not None:
        l1 = X.sum(axis=1)
        over = l1 > l1_max
        if over.any():                 # a hair inside, so that the sum's rounding cannot end above it
            X[over] *= (float(l1_max) / l1[over] * (1.0 - 1e-12))[:, None]
    return X


class DPIADMMClient(PartyBase):
    """Agent p: its own samples (X_p, y_p), its z_p and lambda_p, its noise, its ledger.

    Parameters
    ----------
    agent_id : int
        ``partition-id`` of the node.
    X, y : arrays (I_p, J), (I_p,)
        The agent's samples (features in [0, 1]) and integer labels. A private agent holds its rows
        to its calibration's bounds first (:func:`bounded_rows`).
    num_classes : int
    privacy : dict
        From :func:`agent_privacy_from_node_config` (never from the server).
    store : flower_vfl.privacy.store.PartyStore, str or None
        The agent's store on its own disk (``state-dir``); None: in memory (lives with this
        object, for in-process use).
    source : flower_vfl.clients.source.DeclaredSource or None
        The data the node config declares (the ledger's key); None: ``agent:<agent_id>``.
    seed : int or None
        In-process experiments only: draw iteration t of run r from (seed, r, t), as the
        engine does. A ClientApp never passes one.
    """

    ROLE = "agent"
    #: a malformed message raises (the ClientApp's error reply names the field)
    REPLY_INVALID = False
    #: the agent refuses a replayed round and a spent budget itself (:meth:`_step`); anything else a
    #: user error raises to the ClientApp's error reply
    REFUSALS = ()

    def __init__(self, agent_id, X, y, num_classes, privacy=None, store=None, source=None, seed=None):
        self.agent_id, self.X, self.y = int(agent_id), np.asarray(X, float), np.asarray(y)
        self.party_id = self.agent_id
        self.K = int(num_classes)
        self.Y = one_hot(self.y, self.K)
        self.privacy = privacy or {"eps_bar": None, "delta_bar": 1e-6, "sensitivity": "eq20",
                                   "x_l1_max": None, "delta": 1e-5, "max_epsilon": None}
        self.seed = seed
        self.ledger = None
        if self.privacy["eps_bar"] is not None:
            self.X = bounded_rows(self.X, self.privacy.get("x_l1_max"))
            cap = self.privacy.get("max_epsilon")
            if cap is None:
                raise ValueError(f"agent {self.agent_id} is private (eps_bar={self.privacy['eps_bar']!r}) and has no "
                                 "budget: give privacy['max_epsilon'] (node config dp-max-epsilon)")
            store = store if isinstance(store, PartyStore) else PartyStore(store or ":memory:")
            key, about = (source.key, source.about) if source is not None else (f"agent:{self.agent_id}", None)
            self.ledger = Ledger(store, key, Budget(float(cap), float(self.privacy["delta"]), ACCOUNTANT),
                                 f"agent {self.agent_id}", about)

    def _unit(self, variant: str) -> str:
        """The privacy unit of a release: one sample of this agent, under this calibration."""
        mech = "gaussian" if variant == "outp" else "laplace"
        return f"horizontal-sample:{mech}:{self.privacy['sensitivity']}"

    def releases(self) -> list[dict]:
        """Every private release this agent made on its data, all runs and variants (its ledger)."""
        if self.ledger is None:
            return []
        return [{"t": a.round, "run": a.run, "mechanism": a.mechanism, "noise_multiplier": a.noise_multiplier,
                 "scale": a.sigma, "sensitivity": a.sensitivity} for a in self.ledger.entries]

    # ---------------------------------------------------------------- state
    def _meta(self, context: Context) -> dict:
        if STATE_META in context.state:
            return json.loads(str(context.state[STATE_META]["json"]))
        return {"last_t": 0, "ledger": []}

    def _save(self, context, meta, z, lam, last):
        context.state[STATE_ARRAYS] = ArrayRecord({"z": Array(z), "lam": Array(lam), "last": Array(last)})
        context.state[STATE_META] = ConfigRecord({"json": json.dumps(meta)})

    def _params(self, cfg) -> DPIADMMParams:
        pv = self.privacy
        who = self.who
        for key in ("variant", "trust"):
            if not isinstance(cfg.get(key) if hasattr(cfg, "get") else None, str):
                raise InvalidMessage(f"{who}: config[{key!r}]={cfg.get(key)!r} must be a string", field=f"config.{key}")
        try:      # a, beta, box: finite numbers in the protocol's ranges, then the math's own checks
            return DPIADMMParams(variant=cfg["variant"], eps_bar=pv["eps_bar"],
                                 a=parse_scalar(cfg, "a", 0.0, 1e12, who),
                                 beta=parse_scalar(cfg, "beta", -1.0, 1e12, who),
                                 box=parse_scalar(cfg, "box", 0.0, 1e12, who), trust=cfg["trust"],
                                 delta_bar=pv["delta_bar"], sensitivity=pv["sensitivity"],
                                 x_l1_max=pv["x_l1_max"]).validate()
        except ValueError as exc:
            if isinstance(exc, InvalidMessage):
                raise
            raise InvalidMessage(f"{who}: the message's settings are refused: {exc}", field="config") from None

    def _round(self, content):
        """(cfg, t, rho, I, P, w, final, params) from a train message's ``content``, each typed and
        range-checked before use."""
        who = self.who
        cfg = parse_field(content, "config", "message")
        t = parse_count(cfg, "t", who, default=None, lo=1, hi=10**6)
        rho = parse_scalar(cfg, "rho", 0.0, 1e12, who)
        n = len(self.y)
        I = parse_count(cfg, "I", who, default=None, lo=n, hi=10**12, why=f" (at least this agent's {n} samples)")
        P = parse_count(cfg, "P", who, default=None, lo=1, hi=10**5)
        arr = parse_field(parse_field(content, "arrays", "message"), "w", "arrays")
        w = arr.numpy() if hasattr(arr, "numpy") else np.asarray(arr)
        J = self.X.shape[1]
        if w.shape != (J, self.K) or w.dtype.kind not in "fiu" or not np.all(np.isfinite(w)):
            raise InvalidMessage(f"{who}: arrays['w'] has shape {w.shape} ({w.dtype}); expected finite ({J}, {self.K})",
                                 field="arrays.w")
        final = parse_flag(cfg, "final", who)
        return cfg, t, rho, I, P, np.asarray(w, dtype=float), final, self._params(cfg)

    def _draw(self, t, shape, variant, run_id):
        if self.seed is not None:                          # in-process experiments only
            return standard_draw(int(self.seed), t, shape, variant, run_id)
        return fresh_draw(shape, variant)

    # ------------------------------------------------------------- handlers
    def _identity_fields(self, msg: Message, context: Context) -> dict:
        return {"agent": self.agent_id, "n_samples": int(len(self.y)), "num_features": int(self.X.shape[1]),
                "eps_bar": float(self.privacy["eps_bar"] or 0.0)}

    def _not_after(self, t, last) -> Refused:
        return Refused(f"agent {self.agent_id}: round t={t} is not after the last answered round {last}; "
                       "rounds must increase")

    def train(self, msg: Message, context: Context) -> Message:
        """One agent step (eq. 8 / 9 / OutP) and the dual update (4c); replies with z_p^{t+1}."""
        return self._handle(msg, self._round, lambda parsed: self._step(msg, context, *parsed))

    def _step(self, msg, context, cfg, t, rho, I, P, w, final, p):
        J = self.X.shape[1]
        run = str(context.run_id)
        meta = self._meta(context)
        if p.private:
            done = self.ledger.answer(run, t, "train")
            if done is not None:           # released before (maybe by a crashed process): same answer
                return self._release(msg, done.payload["z"], meta, final)
            last = self.ledger.last_round(run, "train")
            if last is not None and t < last:
                return self._refusal(msg, self._not_after(t, last))
            st = self.ledger.get_state(run)
            if st is not None and STATE_ARRAYS not in context.state:   # a restarted node resumes
                context.state[STATE_ARRAYS] = ArrayRecord({k: Array(v) for k, v in st.items()})
                meta["last_t"] = int(last or 0)
        if STATE_ARRAYS in context.state:
            rec = context.state[STATE_ARRAYS]
            z, lam, last = rec["z"].numpy(), rec["lam"].numpy(), rec["last"].numpy()
        else:
            z, lam, last = np.zeros((J, self.K)), np.zeros((J, self.K)), np.zeros((J, self.K))
        if t == meta["last_t"]:            # a replayed round: the answer already given
            return self._release(msg, last, meta, final)
        if t < meta["last_t"]:
            return self._refusal(msg, self._not_after(t, meta["last_t"]))
        # the engine's function (run_dpiadmm_many), with this agent's block alone: the two paths
        # compute the gradient and eq. (20)'s sensitivity with the same code
        x_l1 = [np.abs(self.X).sum(axis=1)] if p.private else None
        G, l1max = local_gradient_blocks(z[None, None], [self.X], [self.Y], I, p.beta, x_l1, n_agents=P)
        G = G[0, 0]
        l1 = l1max[0] if p.private else None            # (1,): its max is the agent's max
        draw = self._draw(t, (J, self.K), p.variant, int(context.run_id)) if p.private else None
        c1, c3 = outp_constants(len(self.y), I, J, p)
        z_new, info = agent_update(z, lam, w, G, l1, draw, rho, t, p, I, c1, c3)
        lam = dual_step(lam, w, z_new, rho)                                   # (4c)
        if p.private:
            entry = ledger_entry(t, p.variant, p.eps_bar, p.delta_bar, float(np.asarray(info["scale"])),
                                 float(np.asarray(info["sensitivity"])))
            try:
                self._commit(p.variant, run, t, msg, entry, z_new, lam)
            except BudgetExceeded as exc:
                return self._refusal(msg, Refused(self._over_budget(exc, t, entry["mechanism"])))
            meta["ledger"].append(entry)
        meta["last_t"] = t
        self._save(context, meta, z_new, lam, z_new)
        return self._release(msg, z_new, meta, final)

    def _commit(self, variant, run, t, msg, entry, z_new, lam):
        """Charge the release in the agent's one ledger, durable before it leaves (refused past
        dp-max-epsilon, every mechanism composed in one PLD)."""
        h = hashlib.sha256(msg.content["arrays"]["w"].numpy().tobytes() + str(sorted(
            msg.content["config"].items())).encode()).hexdigest()
        sens = entry["sensitivity"]
        self.ledger.commit(run, t, "train", h, unit=self._unit(variant), mechanism=entry["mechanism"],
                           noise_multiplier=noise_multiplier(entry["scale"], sens) if sens > 0 else 0.0,
                           sigma=entry["scale"], sensitivity=sens, payload={"z": z_new},
                           state={"z": z_new, "lam": lam, "last": z_new})

    def _over_budget(self, exc: BudgetExceeded, t, mechanism) -> str:
        return (f"agent {self.agent_id}: one more {mechanism} release (round t={t}) would bring the total on "
                f"its data to epsilon={exc.requested:.4g} (PLD over every release of every run, "
                f"delta={exc.delta:g}), above its dp-max-epsilon={exc.budget:g}; already spent "
                f"epsilon={exc.spent:.4g} over {exc.releases} release(s); refused")

    def _release(self, msg, z, meta, final):
        content = RecordDict({"release": ArrayRecord({"z": Array(np.asarray(z, dtype=float))})})
        if final:
            delta = self.privacy["delta"]
            rep = {"agent": self.agent_id, "eps_bar": self.privacy["eps_bar"]}
            if meta["ledger"]:
                rep["totals"] = account(meta["ledger"], delta)                     # this run
            if self.ledger is not None:
                entries = self.ledger.entries
                rep["totals_all_runs"] = {                                          # everything on this data
                    "releases": len(entries), "delta": delta, "epsilon_pld": self.ledger.epsilon_of(entries),
                    "max_epsilon": self.ledger.budget.epsilon,
                    "mechanisms": dict(Counter(e.mechanism for e in entries))}
            content["privacy"] = ConfigRecord({"report": json.dumps(rep)})
        return self._finish(msg, content)
