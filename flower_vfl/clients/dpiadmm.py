"""An agent of horizontal DP inexact ADMM as Flower message handlers (glue only: the math is
:mod:`flower_vfl.horizontal`).

Trust boundary: the agent's privacy settings (``dp-eps-bar``, ``dp-delta-bar``,
``dp-sensitivity``, ``dp-x-l1-max``, ``dp-seed``, ``dp-max-epsilon``, ``dp-delta``) come from
its *node config* only; the server's messages carry public algorithm settings (t, rho_t, a,
beta, box, ...) and w. The seed never leaves the node (without ``dp-seed`` the agent draws
one from OS entropy and keeps it on its own disk). Noise for iteration t of run r is a
function of (seed, r, t).

With a :class:`flower_vfl.privacy.store.PartyStore` (node config ``state-dir``) every
private release is committed to the agent's SQLite ledger *before* it is sent, with the
agent's iterate: a re-sent round gets the stored answer (no second draw), a restarted
node resumes, the composed total over all runs on this data is the agent's own ledger,
and ``dp-max-epsilon`` (total at ``dp-delta``) is enforced inside the commit.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.errors import UserError
from flower_vfl.horizontal.admm import DPIADMMParams, agent_update, dual_step, outp_constants
from flower_vfl.horizontal.model import local_gradient_blocks, one_hot
from flower_vfl.horizontal.privacy import account, ledger_entry, new_agent_seed, standard_draw

__all__ = ["BudgetSpent", "DPIADMMClient", "agent_privacy_from_node_config"]

STATE_ARRAYS, STATE_META = "hz.agent", "hz.meta"
_PRIVACY_KEYS = ("dp-eps-bar", "dp-delta-bar", "dp-sensitivity", "dp-x-l1-max", "dp-seed", "dp-delta",
                 "dp-max-epsilon")


class BudgetSpent(UserError, RuntimeError):
    """The agent's own dp-max-epsilon would be exceeded by one more release."""


def agent_privacy_from_node_config(nc) -> dict:
    """The agent's own privacy settings; ``dp-eps-bar`` absent or 0 means non-private."""
    eps = float(nc.get("dp-eps-bar", 0) or 0)
    if eps < 0 or not math.isfinite(eps):
        raise ValueError(f"node config dp-eps-bar={eps!r}; give a positive number (0: non-private)")
    seed = nc.get("dp-seed")
    return {"eps_bar": eps if eps > 0 else None, "delta_bar": float(nc.get("dp-delta-bar", 1e-6)),
            "sensitivity": str(nc.get("dp-sensitivity", "eq20")),
            "x_l1_max": float(nc["dp-x-l1-max"]) if "dp-x-l1-max" in nc else None,
            "seed": None if seed in (None, "") else int(seed),
            "delta": float(nc.get("dp-delta", 1e-5)),
            "max_epsilon": float(nc["dp-max-epsilon"]) if "dp-max-epsilon" in nc else None}


class DPIADMMClient:
    """Agent p: its own samples (X_p, y_p), its z_p and lambda_p, its noise.

    Parameters
    ----------
    agent_id : int
        ``partition-id`` of the node.
    X, y : arrays (I_p, J), (I_p,)
        The agent's samples (features in [0, 1]) and integer labels.
    num_classes : int
    privacy : dict
        From :func:`agent_privacy_from_node_config` (never from the server).
    store : flower_vfl.privacy.store.PartyStore or None
        The agent's durable ledger and replay store (its own disk); None keeps everything in
        ``context.state`` (lost with the SuperNode).
    """

    def __init__(self, agent_id, X, y, num_classes, privacy=None, store=None):
        self.agent_id, self.X, self.y = int(agent_id), np.asarray(X, float), np.asarray(y)
        self.K = int(num_classes)
        self.Y = one_hot(self.y, self.K)
        self.privacy = privacy or {"eps_bar": None, "delta_bar": 1e-6, "sensitivity": "eq20",
                                   "x_l1_max": None, "seed": None, "delta": 1e-5, "max_epsilon": None}
        self.store = store
        h = hashlib.sha256(np.ascontiguousarray(self.X).tobytes())
        h.update(np.ascontiguousarray(self.y, dtype=np.int64).tobytes())
        self.fingerprint = h.hexdigest()

    def _unit(self, variant: str) -> str:
        """The ledger's privacy unit: one sample of this agent, under this calibration."""
        mech = "gaussian" if variant == "outp" else "laplace"
        return f"horizontal-sample:{mech}:{self.privacy['sensitivity']}"

    def _key(self, unit: str) -> str:
        return f"{self.fingerprint}:{unit}"

    def _seed(self, unit: str):
        """The configured seed, or one drawn from OS entropy once and kept on the agent's disk."""
        if self.privacy["seed"] is not None:
            return int(self.privacy["seed"])
        if self.store is None:
            return None
        got = self.store.get_state(self._key(unit), "seed")
        if got is None:
            self.store.put_state(self._key(unit), "seed", {"seed": np.array([str(new_agent_seed())])})
            got = self.store.get_state(self._key(unit), "seed")
        return int(str(got["seed"][0]))

    def ledger(self, variant: str) -> list[dict]:
        """Every private release this agent made on this data, all runs (from its store)."""
        if self.store is None:
            return []
        eps, dbar = self.privacy["eps_bar"], self.privacy["delta_bar"]
        return [{"t": a.round, "run": a.run, "mechanism": "gaussian" if variant == "outp" else "laplace",
                 "eps_bar": eps, "delta_bar": dbar if variant == "outp" else 0.0, "scale": a.sigma,
                 "sensitivity": a.sensitivity} for a in self.store.entries(self._key(self._unit(variant)))]

    # ---------------------------------------------------------------- state
    def _meta(self, context: Context) -> dict:
        if STATE_META in context.state:
            return json.loads(str(context.state[STATE_META]["json"]))
        seed = self.privacy["seed"]
        if seed is None:
            seed = self._seed(self._unit(self._variant)) if self.store is not None else new_agent_seed()
        return {"last_t": 0, "seed": str(seed), "ledger": []}

    def _save(self, context, meta, z, lam, last):
        context.state[STATE_ARRAYS] = ArrayRecord({"z": Array(z), "lam": Array(lam), "last": Array(last)})
        context.state[STATE_META] = ConfigRecord({"json": json.dumps(meta)})

    def _params(self, cfg) -> DPIADMMParams:
        pv = self.privacy
        return DPIADMMParams(variant=str(cfg["variant"]), eps_bar=pv["eps_bar"], a=float(cfg["a"]),
                             beta=float(cfg["beta"]), box=float(cfg["box"]), trust=str(cfg["trust"]),
                             delta_bar=pv["delta_bar"], sensitivity=pv["sensitivity"],
                             x_l1_max=pv["x_l1_max"]).validate()

    # ------------------------------------------------------------- handlers
    def identify(self, msg: Message, context: Context) -> Message:
        info = {"agent": self.agent_id, "n_samples": int(len(self.y)), "num_features": int(self.X.shape[1]),
                "eps_bar": float(self.privacy["eps_bar"] or 0.0)}
        return Message(RecordDict({"identity": ConfigRecord(info)}), reply_to=msg)

    def _refuse(self, msg, reason):
        return Message(RecordDict({"refusal": ConfigRecord({"reason": reason})}), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """One agent step (eq. 8 / 9 / OutP) and the dual update (4c); replies with z_p^{t+1}."""
        cfg = msg.content["config"]
        t, rho, I, P = int(cfg["t"]), float(cfg["rho"]), int(cfg["I"]), int(cfg["P"])
        w = msg.content["arrays"]["w"].numpy()
        J = self.X.shape[1]
        if w.shape != (J, self.K) or not np.all(np.isfinite(w)):
            raise ValueError(f"agent {self.agent_id}: w has shape {w.shape}; expected finite ({J}, {self.K})")
        if not (rho > 0 and math.isfinite(rho)) or I < len(self.y) or P < 1:
            raise ValueError(f"agent {self.agent_id}: rho={rho!r}, I={I!r}, P={P!r}; need rho > 0, "
                             f"I >= own sample count {len(self.y)}, P >= 1")
        self._variant = str(cfg["variant"])
        p = self._params(cfg)
        unit, run = self._unit(p.variant), str(context.run_id)
        meta = self._meta(context)
        if self.store is not None and p.private:
            done = self.store.answer(self._key(unit), run, t, "train")
            if done is not None:           # released before (maybe by a crashed process): same answer
                return self._reply(msg, done.payload["z"], meta, bool(cfg.get("final", False)), p)
            last = self.store.last_round(self._key(unit), run, "train")
            if last is not None and t < last:
                return self._refuse(msg, f"agent {self.agent_id}: round t={t} is not after the last answered "
                                         f"round {last}; rounds must increase")
            st = self.store.get_state(self._key(unit), run)
            if st is not None and STATE_ARRAYS not in context.state:   # a restarted node resumes
                context.state[STATE_ARRAYS] = ArrayRecord({k: Array(v) for k, v in st.items()})
                meta["last_t"] = int(last or 0)
        if STATE_ARRAYS in context.state:
            rec = context.state[STATE_ARRAYS]
            z, lam, last = rec["z"].numpy(), rec["lam"].numpy(), rec["last"].numpy()
        else:
            z, lam, last = np.zeros((J, self.K)), np.zeros((J, self.K)), np.zeros((J, self.K))
        if t == meta["last_t"]:            # a replayed round: the answer already given
            return self._reply(msg, last, meta, bool(cfg.get("final", False)), p)
        if t < meta["last_t"]:
            return self._refuse(msg, f"agent {self.agent_id}: round t={t} is not after the last answered "
                                     f"round {meta['last_t']}; rounds must increase")
        # the engine's function (run_dpiadmm_many), with this agent's block alone: the two paths
        # compute the gradient and eq. (20)'s sensitivity with the same code
        x_l1 = [np.abs(self.X).sum(axis=1)] if p.private else None
        G, l1max = local_gradient_blocks(z[None, None], [self.X], [self.Y], I, p.beta, x_l1, n_agents=P)
        G = G[0, 0]
        l1 = l1max[0] if p.private else None            # (1,): its max is the agent's max
        draw = standard_draw(int(meta["seed"]), t, (J, self.K), p.variant, int(context.run_id)) \
            if p.private else None
        c1, c3 = outp_constants(len(self.y), I, J, p)
        z_new, info = agent_update(z, lam, w, G, l1, draw, rho, t, p, I, c1, c3)
        lam = dual_step(lam, w, z_new, rho)                                   # (4c)
        if p.private:
            entry = ledger_entry(t, p.variant, p.eps_bar, p.delta_bar, float(np.asarray(info["scale"])),
                                 float(np.asarray(info["sensitivity"])))
            if self.store is not None:
                try:
                    self._commit(unit, run, t, msg, entry, z_new, lam)
                except BudgetSpent as exc:
                    return self._refuse(msg, str(exc))
            meta["ledger"].append(entry)
        meta["last_t"] = t
        self._save(context, meta, z_new, lam, z_new)
        return self._reply(msg, z_new, meta, bool(cfg.get("final", False)), p)

    def _commit(self, unit, run, t, msg, entry, z_new, lam):
        """Charge the release on the agent's disk before it leaves (refuse past dp-max-epsilon)."""
        cap, delta = self.privacy["max_epsilon"], self.privacy["delta"]

        def check(entries):
            multipliers = [e.noise_multiplier for e in entries]
            if cap is None:
                return
            mech = entry["mechanism"]
            prev = [{"mechanism": mech, "scale": z, "sensitivity": 1.0, "eps_bar": entry["eps_bar"],
                     "delta_bar": entry["delta_bar"]} for z in multipliers]
            total = account(prev + [{**entry, "scale": entry["scale"] / entry["sensitivity"], "sensitivity": 1.0}],
                            delta)["epsilon_pld"] if entry["sensitivity"] > 0 else 0.0
            if total > cap:
                raise BudgetSpent(f"agent {self.agent_id}: one more release would spend epsilon={total:.4g} "
                                  f"(PLD, delta={delta}) on this data, above its dp-max-epsilon={cap}; refused")

        h = hashlib.sha256(msg.content["arrays"]["w"].numpy().tobytes() + str(sorted(
            msg.content["config"].items())).encode()).hexdigest()
        self.store.commit_release(self._key(unit), run, t, "train", h, unit=unit, mechanism=entry["mechanism"],
                                  noise_multiplier=entry["scale"] / entry["sensitivity"] if entry["sensitivity"] else 0.0,
                                  sigma=entry["scale"], sensitivity=entry["sensitivity"], payload={"z": z_new},
                                  check=check, state={"z": z_new, "lam": lam, "last": z_new})

    def _reply(self, msg, z, meta, final, p=None):
        content = RecordDict({"release": ArrayRecord({"z": Array(np.asarray(z, dtype=float))})})
        if final:
            ledger = self.ledger(p.variant) if (self.store is not None and p is not None) else meta["ledger"]
            run_ledger = meta["ledger"]
            rep = {"agent": self.agent_id, "eps_bar": self.privacy["eps_bar"]}
            if run_ledger:
                rep["totals"] = account(run_ledger, self.privacy["delta"])          # this run
            if self.store is not None and ledger:
                rep["totals_all_runs"] = account(ledger, self.privacy["delta"])     # everything on this data
            content["privacy"] = ConfigRecord({"report": json.dumps(rep)})
        return Message(content, reply_to=msg)
