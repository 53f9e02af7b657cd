"""In-process engine: all agents (and several noise seeds) of DP inexact ADMM, vectorized.

One iteration (Algorithms 1-2; OutP in the same order so that the three differ only in
the agent step):

1. server: w^{t+1} from (4a)
2. agents: gradient at their own z_p^t, noise from their own (seed, t), z_p^{t+1} from
   (8) / (9) / Huang's step (the very functions the Flower client calls)
3. duals (4c), computed identically by the server (from the released z_p) and the agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .admm import DPIADMMParams, agent_update, dual_step, outp_constants, rho_schedule, server_step
from .model import error_rate, local_gradient, one_hot, per_sample_l1
from .privacy import account, ledger_entry, standard_draw

__all__ = ["pad_agents", "agent_seeds", "DPIADMMResult", "run_dpiadmm"]


def pad_agents(X_parts, y_parts, K: int):
    """Stack the agents' data into (P, n_max, J) with zero rows and zero one-hot labels as
    padding (they contribute nothing). Returns X, Y (one-hot), n_p."""
    n_p = np.array([len(y) for y in y_parts])
    if len(X_parts) != len(y_parts) or (n_p == 0).any():
        raise ValueError(f"X_parts/y_parts: {len(X_parts)} vs {len(y_parts)} agents, sizes {n_p.tolist()}; "
                         "every agent needs at least one sample")
    J = X_parts[0].shape[1]
    X = np.zeros((len(n_p), n_p.max(), J))
    y = -np.ones((len(n_p), n_p.max()), dtype=int)
    for p, (Xp, yp) in enumerate(zip(X_parts, y_parts)):
        X[p, : len(yp)] = Xp
        y[p, : len(yp)] = yp
    return X, one_hot(y, K), n_p


def agent_seeds(base_seed: int, n_seeds: int, P: int) -> np.ndarray:
    """Distinct 63-bit agent seeds (S, P) derived from one experiment seed (for simulations;
    a deployed agent takes its seed from its own node config)."""
    ss = np.random.SeedSequence(int(base_seed))
    return np.array([[int(c.generate_state(2, np.uint64)[0] >> np.uint64(1)) for c in s.spawn(P)]
                     for s in ss.spawn(n_seeds)], dtype=object)


@dataclass
class DPIADMMResult:
    params: DPIADMMParams
    W: np.ndarray                      #: (S, J, K) final global model per seed
    Z: np.ndarray                      #: (S, P, J, K)
    Lam: np.ndarray
    history: list = field(default_factory=list)   #: rows: t, seed, test_error, noise_abs_mean, cv, rho
    ledgers: list = field(default_factory=list)   #: [seed][agent] -> list of ledger entries

    def privacy(self, delta: float = 1e-5, seed: int = 0) -> list[dict]:
        """Per-agent totals (PLD and basic composition) for one noise seed."""
        return [account(led, delta) for led in self.ledgers[seed]]


def run_dpiadmm(X_parts, y_parts, params: DPIADMMParams, T: int, seeds, K: int | None = None,
                X_test=None, y_test=None, eval_every: int = 10, progress: bool = False,
                keep_ledger: bool = True, dtype=np.float64, stream: int = 0) -> DPIADMMResult:
    """Run T iterations for every noise seed at once.

    Parameters
    ----------
    X_parts, y_parts : lists of arrays
        Agent p's features (I_p, J) (pixels in [0, 1]) and integer labels.
    params : DPIADMMParams
    T : int
        Iterations.
    seeds : array-like (S, P) of int
        Agent p's secret seed in noise repetition s (see :func:`agent_seeds`).
    K : int, optional
        Number of classes (default max label + 1).
    stream : int, default=0
        The run's noise stream (a Flower agent uses its run id; see privacy.agent_rng).
    dtype : numpy dtype, default=float64
        float32 halves the cost of the two GEMMs per iteration (reproduction runs); the
        tests and the Flower path use float64.
    X_test, y_test : optional
        Held-out data; test error of w^{t+1} every ``eval_every`` iterations and at T.
    """
    params.validate()
    if int(T) < 1:
        raise ValueError(f"T={T!r}; run at least one iteration")
    K = int(K or max(int(np.max(y)) for y in y_parts) + 1)
    X, Y, n_p = pad_agents(X_parts, y_parts, K)
    X, Y = X.astype(dtype, copy=False), Y.astype(dtype, copy=False)
    seeds = np.asarray(seeds, dtype=object).reshape(-1, len(n_p))
    S, P, J, I = seeds.shape[0], len(n_p), X.shape[2], int(n_p.sum())
    Z = np.zeros((S, P, J, K), dtype=dtype)
    Lam = np.zeros_like(Z)
    c1, c3 = outp_constants(n_p, I, J, params)
    res = DPIADMMResult(params, None, Z, Lam, ledgers=[[[] for _ in range(P)] for _ in range(S)])
    it = range(1, int(T) + 1)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"{params.variant} eps={params.eps_bar}", leave=False)
    for t in it:
        rho = rho_schedule(t, params)
        W = server_step(Z, Lam, rho)                                        # (4a)
        G, R = local_gradient(Z, X, Y, I, params.beta, P, return_residual=True)
        l1 = per_sample_l1(X, R, I) if params.private else None
        draw = None
        if params.private:
            draw = np.stack([np.stack([standard_draw(seeds[s, p], t, (J, K), params.variant, stream)
                                       for p in range(P)]) for s in range(S)]).astype(dtype, copy=False)
        Z, info = agent_update(Z, Lam, W[:, None], G, l1, draw, rho, t, params, I, c1, c3)
        Lam = dual_step(Lam, W, Z, rho)                                      # (4c)
        if params.private and keep_ledger:
            sc, se = np.broadcast_to(info["scale"], (S, P)), np.broadcast_to(info["sensitivity"], (S, P))
            for s in range(S):
                for p in range(P):
                    res.ledgers[s][p].append(ledger_entry(t, params.variant, params.eps_bar,
                                                          params.delta_bar, sc[s, p], se[s, p]))
        if X_test is not None and (t % eval_every == 0 or t == T or t == 1):
            err = error_rate(W, np.asarray(X_test, dtype=dtype), y_test)
            cv = np.abs(W[:, None] - Z).sum(axis=(1, 2, 3))                 # App. A.10
            nm = info.get("noise_abs_mean")
            for s in range(S):
                res.history.append({"t": t, "seed": s, "test_error": float(err[s]), "rho": rho,
                                    "consensus_violation": float(cv[s]),
                                    "noise_abs_mean": float(np.mean(nm[s])) if nm is not None else 0.0})
    res.W, res.Z, res.Lam = W, Z, Lam          # w^{T+1} of the last iteration (paper indexing)
    return res
