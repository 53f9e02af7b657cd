"""An agent of horizontal DP inexact ADMM as Flower message handlers (glue only: the math is
:mod:`flower_vfl.horizontal`).

Trust boundary: the agent's privacy settings (``dp-eps-bar``, ``dp-delta-bar``,
``dp-sensitivity``, ``dp-x-l1-max``, ``dp-seed``) come from its *node config* only; the
server's messages carry public algorithm settings (t, rho_t, a, beta, box, ...) and w. The
seed never leaves the node (without ``dp-seed`` the agent draws one from OS entropy and
keeps it in its state). Noise for iteration t is a function of (seed, t): a re-sent round
gets the stored answer, and even a recomputation could only reproduce the same draw.
"""

from __future__ import annotations

import json
import math

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from ..horizontal.admm import DPIADMMParams, agent_update, dual_step, outp_constants
from ..horizontal.model import local_gradient, one_hot, per_sample_l1
from ..horizontal.privacy import account, ledger_entry, new_agent_seed, standard_draw

__all__ = ["DPIADMMClient", "agent_privacy_from_node_config"]

STATE_ARRAYS, STATE_META = "hz.agent", "hz.meta"
_PRIVACY_KEYS = ("dp-eps-bar", "dp-delta-bar", "dp-sensitivity", "dp-x-l1-max", "dp-seed", "dp-delta")


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
            "delta": float(nc.get("dp-delta", 1e-5))}


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
    """

    def __init__(self, agent_id, X, y, num_classes, privacy=None):
        self.agent_id, self.X, self.y = int(agent_id), np.asarray(X, float), np.asarray(y)
        self.K = int(num_classes)
        self.Y = one_hot(self.y, self.K)
        self.privacy = privacy or {"eps_bar": None, "delta_bar": 1e-6, "sensitivity": "eq20",
                                   "x_l1_max": None, "seed": None, "delta": 1e-5}

    # ---------------------------------------------------------------- state
    def _meta(self, context: Context) -> dict:
        if STATE_META in context.state:
            return json.loads(str(context.state[STATE_META]["json"]))
        seed = self.privacy["seed"] if self.privacy["seed"] is not None else new_agent_seed()
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
        meta = self._meta(context)
        if STATE_ARRAYS in context.state:
            rec = context.state[STATE_ARRAYS]
            z, lam, last = rec["z"].numpy(), rec["lam"].numpy(), rec["last"].numpy()
        else:
            z, lam, last = np.zeros((J, self.K)), np.zeros((J, self.K)), np.zeros((J, self.K))
        if t == meta["last_t"]:            # a replayed round: the answer already given
            return self._reply(msg, last, meta, bool(cfg.get("final", False)))
        if t < meta["last_t"]:
            return self._refuse(msg, f"agent {self.agent_id}: round t={t} is not after the last answered "
                                     f"round {meta['last_t']}; rounds must increase")
        p = self._params(cfg)
        G, R = local_gradient(z, self.X, self.Y, I, p.beta, P, return_residual=True)
        l1 = per_sample_l1(self.X, R, I) if p.private else None
        draw = standard_draw(int(meta["seed"]), t, (J, self.K), p.variant) if p.private else None
        c1, c3 = outp_constants(len(self.y), I, J, p)
        z_new, info = agent_update(z, lam, w, G, l1, draw, rho, t, p, I, c1, c3)
        lam = dual_step(lam, w, z_new, rho)                                   # (4c)
        if p.private:
            meta["ledger"].append(ledger_entry(t, p.variant, p.eps_bar, p.delta_bar,
                                               float(np.asarray(info["scale"])), float(np.asarray(info["sensitivity"]))))
        meta["last_t"] = t
        self._save(context, meta, z_new, lam, z_new)
        return self._reply(msg, z_new, meta, bool(cfg.get("final", False)))

    def _reply(self, msg, z, meta, final):
        content = RecordDict({"release": ArrayRecord({"z": Array(np.asarray(z, dtype=float))})})
        if final:
            rep = {"agent": self.agent_id, "eps_bar": self.privacy["eps_bar"],
                   **({"totals": account(meta["ledger"], self.privacy["delta"])} if meta["ledger"] else {})}
            content["privacy"] = ConfigRecord({"report": json.dumps(rep)})
        return Message(content, reply_to=msg)
