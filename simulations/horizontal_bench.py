"""Cost ratios of the horizontal engine, measured in one run (the machine is shared: ratios,
not absolute times, are the result).

1. Fashion-MNIST, 10 agents x 6000, ObjT private: seconds per iteration per noise seed for
   S = 1 and S = 5 seeds folded into one GEMM per agent, float64 and float32.
2. The Flower path (LocalGrid, real Messages, one client object per agent) against the
   in-process engine on the same small problem (digits, 4 agents), same seeds.

    python simulations/horizontal_bench.py [--iterations 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_vfl.horizontal import DPIADMMParams, agent_seeds, run_dpiadmm  # noqa: E402


def fmnist(T):
    from flower_vfl.horizontal.data import fashion_mnist_split
    Xp, yp, _, _ = fashion_mnist_split(10, "iid")
    out = {}
    for dtype in (np.float64, np.float32):
        for S in (1, 5):
            t0 = time.process_time()
            w0 = time.perf_counter()
            run_dpiadmm(Xp, yp, DPIADMMParams(variant="objt", eps_bar=1.0), T, agent_seeds(0, S, 10), dtype=dtype,
                        keep_ledger=False)
            out[(np.dtype(dtype).name, S)] = ((time.process_time() - t0) / (T * S), (time.perf_counter() - w0) / (T * S))
    return out


def flower_vs_engine(T):
    from sklearn.datasets import load_digits

    from flower_vfl.clients import DPIADMMClient
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    from flower_vfl.horizontal.data import split_arrays
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.strategies.dpiadmm import DPIADMMConfig, DPIADMMStrategy
    X, y = load_digits(return_X_y=True)
    Xp, yp = split_arrays(X / 16.0, y, 4)
    seeds = [1, 2, 3, 4]
    clients = {}

    def client(ctx):
        pid = int(ctx.node_config["partition-id"])
        if pid not in clients:
            clients[pid] = DPIADMMClient(pid, Xp[pid], yp[pid], 10, agent_privacy_from_node_config(ctx.node_config),
                                         seed=seeds[pid])     # the engine's draws (in-process experiment)
        return clients[pid]

    grid = LocalGrid({"train": lambda m, c: client(c).train(m, c),
                      "query.identify": lambda m, c: client(c).identify(m, c)},
                     {100 + i: {"partition-id": i, "dp-eps-bar": 1.0, "dp-sensitivity": "eq20", "dp-max-epsilon": 1e6} for i in range(4)})
    w0 = time.perf_counter()
    DPIADMMStrategy(DPIADMMConfig(variant="objt", num_agents=4, num_features=64, num_classes=10,
                                  num_iterations=T, a=1.0)).start(grid)
    t_flower = time.perf_counter() - w0
    w0 = time.perf_counter()
    run_dpiadmm(Xp, yp, DPIADMMParams(variant="objt", eps_bar=1.0), T, [seeds], K=10, stream=1)
    return t_flower, time.perf_counter() - w0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=5)
    args = ap.parse_args()
    res = fmnist(args.iterations)
    base = res[("float64", 1)][0]
    print("Fashion-MNIST 10x6000, ObjT private: CPU s per iteration per seed (wall s); ratio to float64 S=1")
    for (dt, S), (cpu, wall) in res.items():
        print(f"  {dt:8s} S={S}: {cpu:.3f} ({wall:.3f})  ratio {cpu / base:.2f}")
    tf, te = flower_vs_engine(max(args.iterations * 10, 50))
    print(f"digits 4 agents, {max(args.iterations * 10, 50)} iterations: Flower path (LocalGrid) {tf:.2f} s, "
          f"engine {te:.2f} s, ratio {tf / te:.1f}")


if __name__ == "__main__":
    main()
