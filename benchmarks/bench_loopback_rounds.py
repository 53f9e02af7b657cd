"""Seconds per round on real SuperNodes (loopback SuperLink + 2 SuperNodes, flwr 1.41, insecure).

Modes, run as interleaved repetitions (``--pairs``) so that a busy stretch of a shared machine
hits all of them alike; per-round time = median of the differences of ``elapsed_s`` between
consecutive rounds in report.json (so start-up, identify and round 1 are excluded):

- ``before``: ``FLOWER_VFL_BLOCK_CACHE=0`` (every message parses the data again) and Flower's
  default SuperExec task poll (1 s); as before this change except that Flower's commands are
  started without the pyenv shim here too (deploy_local puts the interpreter's bin first);
- ``after``: ``flower_vfl.deploy.local.deploy_local(isolation='subprocess')`` (Flower's isolation;
  the party's block cache, the SuperExec polling every 0.2 s);
- ``warm``: ``isolation='warm'`` with Flower's own ``flower-supernode``: SuperNodes with ``--isolation
  process`` served by ``flower_vfl.deploy.warm_exec`` (each message's ClientApp process is forked
  from an interpreter that has already imported flwr, numpy and scipy);
- ``poll``: ``after`` with the SuperNodes started as ``flower-vfl-supernode --idle-poll``
  (``--idle-poll``, 0.5 s: :mod:`flower_vfl.deploy.supernode`, Flower's ``flower-supernode`` with its
  hard-coded 3 s idle sleep, ``flwr/supernode/start_client_internal.py``, capped);
- ``warm-poll``: ``warm`` and ``poll`` together: ``deploy_local``'s default;
- ``flower-pull``: ``after`` with the ServerApp pulling replies through Flower's own
  ``send_and_receive`` (3 s between pulls) instead of the strategy's loop.

Each deployment gets its own state dir (node config ``state-dir``), so the block cache starts
cold in every deployment (the identify message fills it).

    nice python -W ignore benchmarks/bench_loopback_rounds.py --dataset a9a \\
        --data-dir ../shared/data/a9a --rounds 5 --pairs 2 --modes before,after,warm,poll,warm-poll
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flower_vfl.deploy.local import deploy_local

ROOT = Path(__file__).resolve().parents[1]
MODES = ("before", "after", "warm", "poll", "warm-poll", "flower-pull")
IDLE_POLL_S = 0.5

_AFTER = {"FLOWER_VFL_BLOCK_CACHE": None, "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": None, "FLOWER_VFL_GRID_PULL": None}
ENV = {  # mode -> environment of the deployment (None: unset)
    "before": {"FLOWER_VFL_BLOCK_CACHE": "0", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0",
               "FLOWER_VFL_GRID_PULL": None},
    "after": _AFTER, "warm": _AFTER, "poll": _AFTER, "warm-poll": _AFTER,
    "flower-pull": {**_AFTER, "FLOWER_VFL_GRID_PULL": "flower"},
}


def per_round(workdir, rc, mode, data_dir):
    saved = {k: os.environ.get(k) for k in ENV[mode]}
    for k, v in ENV[mode].items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    nodes = {m: {"state-dir": str(Path(workdir) / f"party{m}-state"), **({"data-dir": data_dir} if data_dir else {})}
             for m in range(2)}
    t0 = time.monotonic()
    try:
        res = deploy_local(workdir, 2, rc, node_configs=nodes, app_dir=ROOT, tls=False, auth=False, timeout=1800,
                           isolation="warm" if mode.startswith("warm") else "subprocess",
                           idle_poll=IDLE_POLL_S if mode.endswith("poll") else None)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    wall = time.monotonic() - t0
    rows = json.loads((Path(res["out_dir"]) / "report.json").read_text())["rounds"]
    el = [r["elapsed_s"] for r in rows]
    return float(statistics.median(np.diff(el))), res["exit_code"], wall


_STAGE = """
import os, sys, time, json
t0 = time.perf_counter()
import flwr.supernode.runtime.run_clientapp, flower_vfl.apps.client
t1 = time.perf_counter()
from flower_vfl.io.party_cache import cached_party_block
D, _ = cached_party_block("a9a", 0, 2, sys.argv[1], sys.argv[2])
t2 = time.perf_counter()
import numpy as np
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
n = D.shape[0]
PartyUpdate(D, get_penalty("l2"), 1e-4).step(np.ones(n), np.zeros(n), 1e-5, 1.0, 0.5)
t3 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "block": t2 - t1, "first_x_update": t3 - t2}))
"""


def _fork_ready_s() -> float:
    """Wall time from fork to a child that has imported flower_vfl.apps.client, from a parent that
    has imported what flower_vfl.deploy.warm_exec imports (as the warm SuperExec does)."""
    import importlib
    from flower_vfl.deploy.warm_exec import WARM_IMPORTS
    for mod in WARM_IMPORTS:
        importlib.import_module(mod)
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for name in [m for m in sys.modules if m.startswith("flower_vfl")]:
                del sys.modules[name]
            import flower_vfl.apps.client  # noqa: F401
            code = 0 if "flower_vfl.apps.client" in sys.modules else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the forked child failed to import flower_vfl.apps.client (status {status})")
    return time.perf_counter() - t


def stage_costs(data_dir: str, reps: int) -> dict:
    """Per-message costs on a party, medians of ``reps`` fresh processes: interpreter start to
    our handlers imported (``wall``, ``imports``), the party's block parsed (cache off) or
    loaded from its cache, the first x-update (builds the factorization), and the same
    readiness from a warm fork."""
    import subprocess
    out: dict = {"fresh_wall": [], "imports": [], "block_parse": [], "block_cached": [], "first_x_update": [],
                 "fork_ready": []}
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as state:
        for i in range(reps + 1):            # the first cached run writes the cache: not counted
            for cache in ("0", "1"):
                env = dict(os.environ, FLOWER_VFL_BLOCK_CACHE=cache)
                t = time.perf_counter()
                res = subprocess.run([sys.executable, "-W", "ignore", "-c", _STAGE, data_dir, state], env=env,
                                     capture_output=True, text=True, check=True)
                wall = time.perf_counter() - t
                r = json.loads(res.stdout.strip().splitlines()[-1])
                if i == 0:
                    continue
                out["block_parse" if cache == "0" else "block_cached"].append(r["block"])
                if cache == "1":
                    out["fresh_wall"].append(wall - r["block"] - r["first_x_update"])
                    out["imports"].append(r["imports"])
                    out["first_x_update"].append(r["first_x_update"])
            if i:
                out["fork_ready"].append(_fork_ready_s())
    return {k: float(statistics.median(v)) for k, v in out.items()}


def main(argv=None):
    global IDLE_POLL_S
    # SIGTERM -> SystemExit: deploy_local's cleanup (every process group it started) runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2, help="interleaved repetitions of all modes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dataset", default="a9a")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--modes", default="before,after,warm,poll,warm-poll", help=f"comma-separated, of {MODES}")
    ap.add_argument("--idle-poll", type=float, default=IDLE_POLL_S,
                    help="the poll modes' flower-vfl-supernode --idle-poll (seconds, default 0.5)")
    ap.add_argument("--stages", type=int, default=0,
                    help="also time a party's per-message stages in N fresh processes (needs --data-dir, a9a)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_loopback_rounds.json"))
    args = ap.parse_args(argv)
    IDLE_POLL_S = args.idle_poll
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes {bad} not in {MODES}")
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else ""
    rc = {"dataset": args.dataset, "num-parties": 2, "max-rounds": args.rounds}
    if data_dir:
        rc["data-dir"] = data_dir
    out = {m: [] for m in modes}
    walls = {m: [] for m in modes}
    loads = []
    for i in range(args.pairs):
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as d:
                s, code, wall = per_round(d, rc, mode, data_dir)
            out[mode].append(s)
            walls[mode].append(wall)
            loads.append(Path("/proc/loadavg").read_text().split()[0])
            print(f"rep {i + 1} {mode:11s}: {s:.2f} s/round (exit {code}; deployment {wall:.0f} s; "
                  f"load {loads[-1]})", flush=True)
    stages = None
    if args.stages:
        stages = stage_costs(data_dir, args.stages)
        print("per-message stages (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in stages.items()), flush=True)
    base = modes[0]
    ratios = {m: [b / x for b, x in zip(out[base], out[m])] for m in modes[1:]}
    for m, r in ratios.items():
        print(f"{base}/{m} per repetition: {[round(v, 2) for v in r]}")
    Path(args.out).write_text(json.dumps({
        "config": rc, "modes": modes, "idle_poll_s": IDLE_POLL_S, "seconds_per_round": out, "deployment_wall_s": walls,
        f"ratio_{base}_over": ratios, "loadavg_1min_after_each": loads, "stages_s": stages,
        "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *sys.argv[1:]])}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
