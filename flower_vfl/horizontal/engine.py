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

from flower_vfl.core.rounds import run_rounds
from flower_vfl.horizontal.admm import DPIADMMParams, agent_update, dual_step, outp_constants, rho_schedule, server_step
from flower_vfl.horizontal.model import error_rate, local_gradient_blocks, one_hot
from flower_vfl.horizontal.privacy import account, ledger_entry, standard_draw

__all__ = ["pad_agents", "agent_seeds", "DPIADMMResult", "run_dpiadmm", "run_dpiadmm_many"]

_BLOCK = 1 << 18      # floats of (seeds x agents x J x K) per agent step: ~1 MB in float32, the L2


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
    progress : bool or callable, default=False
        True: a tqdm bar; a callable is called with t after every iteration.
    """
    return run_dpiadmm_many(X_parts, y_parts, [params], T, [seeds], K, X_test, y_test, eval_every,
                            progress, keep_ledger, dtype, stream)[0]


def run_dpiadmm_many(X_parts, y_parts, params_list, T: int, seeds_list, K: int | None = None,
                     X_test=None, y_test=None, eval_every: int = 10, progress: bool = False,
                     keep_ledger: bool = True, dtype=np.float64, stream: int = 0) -> list[DPIADMMResult]:
    """Several settings (variant, eps_bar, ...) on the same agents at once: one result per
    ``params_list[i]`` with seeds ``seeds_list[i]`` (S_i, P), identical to running each alone.

    The settings share each agent's two GEMMs per iteration (all their seeds folded into the
    columns, :func:`~.model.local_gradient_blocks`); every other step runs per setting. Agents
    of unequal sizes are not padded.
    """
    if len(params_list) != len(seeds_list) or not params_list:
        raise ValueError(f"params_list/seeds_list: {len(params_list)} vs {len(seeds_list)} settings; "
                         "give one seed array per setting")
    for p in params_list:
        p.validate()
    if int(T) < 1:
        raise ValueError(f"T={T!r}; run at least one iteration")
    n_p = np.array([len(y) for y in y_parts])
    if len(X_parts) != len(y_parts) or (n_p == 0).any():
        raise ValueError(f"X_parts/y_parts: {len(X_parts)} vs {len(y_parts)} agents, sizes {n_p.tolist()}; "
                         "every agent needs at least one sample")
    K = int(K or max(int(np.max(y)) for y in y_parts) + 1)
    Xs = [np.ascontiguousarray(x, dtype=dtype) for x in X_parts]
    Ys = [one_hot(np.asarray(y), K).astype(dtype) for y in y_parts]
    x_l1 = [np.abs(x).sum(axis=1) for x in Xs]                 # ||x_i||_1, constant over the run
    P, J, I = len(n_p), Xs[0].shape[1], int(n_p.sum())
    seeds_list = [np.asarray(s, dtype=object).reshape(-1, P) for s in seeds_list]
    sizes = [len(s) for s in seeds_list]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    Z = np.zeros((bounds[-1], P, J, K), dtype=dtype)           # all settings' seeds stacked
    Lam = np.zeros_like(Z)
    Wall = np.zeros((bounds[-1], J, K), dtype=dtype)
    any_private = any(p.private for p in params_list)
    consts = [outp_constants(n_p, I, J, p) for p in params_list]
    results = [DPIADMMResult(p, None, None, None, ledgers=[[[] for _ in range(P)] for _ in range(S)])
               for p, S in zip(params_list, sizes)]
    Xt = None if X_test is None else np.asarray(X_test, dtype=dtype)
    report = progress if callable(progress) else None
    bar = None
    if progress and report is None:
        from tqdm.auto import tqdm
        bar = tqdm(total=int(T), desc=", ".join(f"{p.variant} eps={p.eps_bar}" for p in params_list)[:60], leave=False)
    rhos, noise = [], []          # iteration t's rho_t and noise_abs_mean per setting, for its evaluation

    def step(t):
        rhos[:] = [rho_schedule(t, p) for p in params_list]
        for i, rho in enumerate(rhos):                                       # (4a)
            sl = slice(bounds[i], bounds[i + 1])
            Wall[sl] = server_step(Z[sl], Lam[sl], rho)
        if len({p.beta for p in params_list}) == 1:                          # agents' gradients
            G, l1max = local_gradient_blocks(Z, Xs, Ys, I, params_list[0].beta, x_l1 if any_private else None)
        else:
            G, l1max = _gradient_per_beta(Z, Xs, Ys, I, params_list, bounds, x_l1, any_private)
        noise.clear()
        for i, (params, rho, res) in enumerate(zip(params_list, rhos, results)):
            sl = slice(bounds[i], bounds[i + 1])
            seeds, S = seeds_list[i], sizes[i]
            W = Wall[sl]
            c1, c3 = consts[i]
            pb = max(1, _BLOCK // (S * J * K))             # agents per block: the step's passes stay in cache
            infos = []
            for a in range(0, P, pb):
                ab = slice(a, min(a + pb, P))
                draw = l1 = None
                if params.private:
                    draw = np.empty((S, ab.stop - a, J, K), dtype=dtype)
                    for s in range(S):
                        for p in range(a, ab.stop):
                            draw[s, p - a] = standard_draw(seeds[s, p], t, (J, K), params.variant, stream)
                    l1 = l1max[sl, ab][..., None]                              # max already taken
                Lb = Lam[sl, ab]
                Zi, info = agent_update(Z[sl, ab], Lb, W[:, None], G[sl, ab], l1, draw, rho, t, params, I, c1, c3[ab])
                Lam[sl, ab] = dual_step(Lb, W, Zi, rho)                        # (4c)
                Z[sl, ab] = Zi
                infos.append(info)
            info = {k: np.concatenate([x[k] for x in infos], axis=1)              # (S, P) each
                    for k in ("scale", "sensitivity", "noise_abs_mean") if k in infos[0]}
            if params.private and keep_ledger:
                sc = np.broadcast_to(info["scale"], (S, P))
                se = np.broadcast_to(info["sensitivity"], (S, P))
                for s in range(S):
                    for p in range(P):
                        res.ledgers[s][p].append(ledger_entry(t, params.variant, params.eps_bar,
                                                              params.delta_bar, sc[s, p], se[s, p]))
            noise.append(info.get("noise_abs_mean"))
        return None, False                 # the rows are the evaluations' (one per setting and seed)

    def evaluate(t, row):
        for i, (rho, res, nm) in enumerate(zip(rhos, results, noise)):
            sl = slice(bounds[i], bounds[i + 1])
            W = Wall[sl]
            err = error_rate(W, Xt, y_test)
            cv = np.abs(W[:, None] - Z[sl]).sum(axis=(1, 2, 3))             # App. A.10
            for s in range(sizes[i]):
                res.history.append({"t": t, "seed": s, "test_error": float(err[s]), "rho": rho,
                                    "consensus_violation": float(cv[s]),
                                    "noise_abs_mean": float(np.mean(nm[s])) if nm is not None else 0.0})

    def on_round(t, row, stop):
        if bar is not None:
            bar.update()
        if report is not None:
            report(t)

    try:     # the one round loop (core/rounds.py): w^{t+1} and the held-out error every eval_every iterations,
        # after the first and after the last
        run_rounds(step, int(T), evaluate=None if Xt is None else evaluate, eval_every=eval_every, at_start=True,
                   on_round=on_round)
    finally:
        if bar is not None:
            bar.close()
    for i, res in enumerate(results):        # w^{T+1} of the last iteration (paper indexing)
        sl = slice(bounds[i], bounds[i + 1])
        res.W, res.Z, res.Lam = Wall[sl].copy(), Z[sl].copy(), Lam[sl].copy()
    return results


def _gradient_per_beta(Z, Xs, Ys, I, params_list, bounds, x_l1, any_private):
    """Settings with different beta: one gradient call per setting."""
    G = np.empty_like(Z)
    l1 = np.empty(Z.shape[:2], dtype=Z.dtype)
    for i, p in enumerate(params_list):
        sl = slice(bounds[i], bounds[i + 1])
        G[sl], li = local_gradient_blocks(Z[sl], Xs, Ys, I, p.beta, x_l1 if any_private else None)
        if li is not None:
            l1[sl] = li
    return G, l1
