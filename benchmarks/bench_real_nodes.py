"""Seconds per ADMM round on real Flower nodes vs Flower's own empty-app round trip, same deployment.

One deployment (``flower_vfl.deploy.local.deploy_local``: a SuperLink and 2 SuperNodes on
loopback, TLS with a generated CA, SuperNode keys registered and bound to parties, the warm
executor, ``flower-vfl-supernode``) serves, one after the other, ``--pairs`` times:

1. our job: a9a, paper split, 2 parties, ``--rounds`` ADMM rounds (``tol`` 0: every round);
   s/round = median of the differences of ``elapsed_s`` in report.json over rounds 2..R (start-up,
   identify and round 1 excluded);
2. Flower's round trip with ``benchmarks/flower_noop`` on the same SuperLink and SuperNodes: one
   message to each node and wait for both replies (``--repeats`` per mode; modes ``tiny`` and
   ``payload``: our round's bytes as Flower's ArrayRecords; ``packed``: the same bytes as ``bytes``
   values of one ConfigRecord, as our central node and parties send them, :mod:`flower_vfl.io.wire`;
   ``packed-v``: packed with one N-vector down, as our central node sends each party its x-update
   target v at alpha = 1 after round 1: the mode whose bytes are our round's), pulled by the schedule our central node uses
   (``pull-first``/``pull-max`` = ``flower_vfl.strategies.exchange.PULL_FIRST_S``/``PULL_MAX_S``), and
   with ``--flower-pull`` also by Flower's own ``grid.send_and_receive``.

The split of our round comes from ``$FLOWER_VFL_TIMING`` (set here): the central node's exchange
(``send_and_receive``) and each forked ClientApp (``warm_exec``) append wall-clock stamps; per round
(median over rounds 2..R):

- central compute: the ServerApp between two exchanges (z/y-update, objective, checks);
- party compute: the ClientApp's handler (``ClientApp.__call__``), the slower party;
- party process: the forked ClientApp before and after its handler (pull the message and the FAB
  from its SuperNode, import the app from the FAB, push the reply and its context);
- delivery: push -> the ClientApp forked (the SuperNode's pull poll, its pull of the message over
  TLS, the SuperExec's task poll);
- return: the ClientApp ended -> the central node has both replies (the SuperNode's reply poll,
  its push over TLS, the central node's pull poll).

the round's bytes to and from each party (``bytes_to_each_party`` / ``bytes_from_each_party``: Array
data and packed ``.npy`` bytes), and Flower's transport within them (from the nodes' stamps, ``flower-vfl-supernode``): the central
node's push of the round's requests (``central_push``), the nodes' message stored after that push
ended (``node_pull_after_push``), the ClientApp's pull of its message and context from its node
(``clientapp_pull``), its exit -> its node's reply pushed to the SuperLink (``node_reply_push``), then
the central node's poll wait (``central_poll_wait``) and its pull of the replies (``central_pull``).

Each of our jobs after the first also gets a ``timeline_s``: the seconds after ``flwr run`` started at
which ``flwr run`` returned, the streamed log showed each of :data:`MILESTONES`, the log stream ended
and the status was read as finished (where the time outside the rounds goes).

Delivery and return are Flower transport plus polling waits; the empty app's round trip is the
same two without our compute.

    python -W ignore benchmarks/bench_real_nodes.py --data-dir ../shared/data/a9a --rounds 20 --pairs 2

``--app-dir T`` submits the app of another flower-vfl tree T (its FAB carries its own
``flower_vfl``; the deployment, warm executor included, is this tree's; no split there if T lacks
the timing stamps). Repeated (``--app-dir before --app-dir after``), the trees are compared on the
one deployment: each pair runs every tree once, in alternated order (A B, B A, ...), each of our
jobs followed by its own empty-app job; the summary gives, per tree, s/round, the ratio to the
empty app per mode (``packed-v``: the same packed bytes as our round) and the median per-round split.

    python -W ignore benchmarks/bench_real_nodes.py --data-dir ../shared/data/a9a --rounds 20 --pairs 3 \
        --repeats 10 --modes packed,packed-v --app-dir /tmp/before --app-dir /tmp/after

Every process is started in its own session and stopped by its process group at the end.
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

ROOT = Path(__file__).resolve().parents[1]
NOOP_APP = Path(__file__).resolve().parent / "flower_noop"
TIMING_ENV = "FLOWER_VFL_TIMING"


def _med(v):
    return float(statistics.median(v)) if v else float("nan")


def _lines(path: Path, since: float) -> list[dict]:
    if not path.exists():
        return []
    out = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    def when(r):                     # the central node's exchanges, the ClientApps, the nodes' pulls and replies
        return next((r[k] for k in ("t_push", "t_fork", "t_pull0", "t_reply0", "t") if k in r), 0)
    return [r for r in out if when(r) >= since]


def split_rounds(timing: list[dict], rounds: int) -> dict:
    """Per-round split (medians over the training rounds 2..R) from the timing stamps of one job."""
    server = sorted((r for r in timing if r["who"] == "server"), key=lambda r: r["t_push"])
    party = [r for r in timing if r["who"] == "party"]
    pulled = [r for r in timing if r["who"] == "node" and "t_pull1" in r]
    replied = [r for r in timing if r["who"] == "node" and "t_reply1" in r]
    if not server or not party:
        return {}
    # the job's exchanges: identify ..., then one per round (train), then the evaluation(s); the
    # training rounds are the run of `rounds` exchanges with 2 messages after the identify one(s)
    ex = [r for r in server if r["messages"] == 2]
    if len(ex) < rounds + 1:
        return {}
    train = ex[-(rounds + 1):-1] if len(ex) > rounds + 1 else ex[:rounds]
    rows = []
    for k in range(1, len(train)):           # round 1 excluded
        e = train[k]
        kids = [p for p in party if e["t_push"] <= p["t_fork"] <= e["t_done"] and "t_call0" in p]
        if len(kids) != 2:
            continue
        last = max(kids, key=lambda p: p["t_exit"])
        nxt = train[k + 1]["t_push"] if k + 1 < len(train) else None
        rows.append({
            "exchange": e["t_done"] - e["t_push"],
            "central_compute": (nxt - e["t_done"]) if nxt else float("nan"),
            "party_compute": max(p["t_call1"] - p["t_call0"] for p in kids),
            "party_process": (last["t_call0"] - last["t_fork"]) + (last["t_exit"] - last["t_call1"]),
            "delivery": last["t_fork"] - e["t_push"],
            "return": e["t_done"] - last["t_exit"],
            "server_pulls": e["pulls"],
            # the round's payload per party (Array data and packed .npy bytes, flower_vfl.strategies.exchange)
            **({"bytes_to_each_party": _med(list(map(float, e["array_bytes_out"].values())))}
               if e.get("array_bytes_out") else {}),
            **({"bytes_from_each_party": _med(list(map(float, e["array_bytes_in"].values())))}
               if e.get("array_bytes_in") else {}),
        })
        # Flower's transport, stage by stage (stamps of this tree: the nodes' pulls and replies)
        ns = [n for n in pulled if e["t_push"] <= n["t_pull1"] <= e["t_done"]]
        rs = [r for r in replied if e["t_push"] <= r["t_reply1"] <= e["t_done"]]
        if len(ns) == 2 and len(rs) == 2 and "t_pull_last0" in e and all("pull_task_input" in p for p in kids):
            reply = max(r["t_reply1"] for r in rs)
            rows[-1].update({
                "central_push": e["t_pushed"] - e["t_push"],
                "node_pull_after_push": max(n["t_pull1"] for n in ns) - e["t_pushed"],
                "clientapp_pull": max(p["pull_task_input"] for p in kids),
                "node_reply_push": reply - last["t_exit"],
                "central_poll_wait": max(0.0, e["t_pull_last0"] - reply),
                "central_pull": e["t_done"] - max(e["t_pull_last0"], reply),
            })
    if not rows:
        return {}
    keys = dict.fromkeys(k for r in rows for k in r)
    return {k: _med([r[k] for r in rows if k in r and not np.isnan(r[k])]) for k in keys} | {"rounds_split": len(rows)}


#: the milestones of a job's wall time (``timeline``): the first log line matching each, in order
MILESTONES = (("first log line", r"."), ("strategy started", r"Starting VerticalADMMStrategy"),
              ("parties identified", r"\bparties: \d+ -> node"), ("round 1 logged", r"\bround 1: train_loss="),
              ("last round logged", None), ("final evaluation logged", r"\bfinal \(round \d+\)"))


def timeline(stamps: list, submit_s: float, wall_s: float) -> dict:
    """Seconds after ``flwr run`` started at which the job passed each milestone: ``flwr run``
    returned (FAB built, uploaded, run id), each of :data:`MILESTONES` in the streamed log, and the
    status read as finished (the wall time)."""
    import re
    out = {"flwr run returned": submit_s}
    for name, pat in MILESTONES:
        if pat is None:                                     # the last 'round k:' line
            hits = [t for t, line in stamps if re.search(r"\bround \d+: train_loss=", line)]
            out[name] = hits[-1] if hits else None
        else:
            out[name] = next((t for t, line in stamps if re.search(pat, line)), None)
    out["status read as finished"] = wall_s
    return out


def run_job(procs, workdir: Path, env: dict, conn: str, app: Path, run_config: str, log: Path) -> dict:
    from flower_vfl.deploy.local import exit_code, submit, wait_run

    t0 = time.monotonic()
    run_id = submit(app, conn, run_config, env)
    t_submit = time.monotonic() - t0
    stamps: list = []
    rec = wait_run(run_id, conn, env, log, timeout=1800, poll=0.5,
                   on_line=lambda line: stamps.append((time.monotonic() - t0, line)))
    wall = time.monotonic() - t0
    tl = timeline(stamps, t_submit, wall)
    if rec.get("stream_ended_at") is not None:      # the log stream ended (the run finished): then `flwr ls`
        tl = {**{k: v for k, v in tl.items() if k != "status read as finished"},
              "log stream ended": rec["stream_ended_at"] - t0, "status read as finished": wall}
    return {"run_id": run_id, "exit_code": exit_code(rec), "wall_s": wall, "status": rec.get("status"),
            "timeline_s": tl}


def rounds_to_gap(gap: float, data_dir: str, cap: int = 300) -> tuple[int, float]:
    """(k, f*): the first round whose objective is within ``gap`` (relative) of f*, the smallest
    objective of ``cap`` rounds, both from the real ServerApp and party handlers on the in-process
    LocalGrid with the job's run config (the same rounds as on the nodes: tests/test_trajectories.py)."""
    from flwr.app import Context, RecordDict

    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": cap, "tol": 0.0, "data-dir": data_dir}
    handlers = {"query.identify": ca.identify, "train": ca.train, "evaluate": ca.evaluate}
    grid = LocalGrid(handlers, {100 + m: {"partition-id": m, "data-dir": data_dir} for m in range(2)}, rc)
    st = sa.make_strategy(rc)
    from flwr.app import ArrayRecord
    st.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=cap, timeout=600)
    obj = np.array([r["objective"] for r in st.history_])
    f_star = float(obj.min())
    hit = np.flatnonzero((obj - f_star) / abs(f_star) <= gap)
    return int(hit[0]) + 1, f_star


def _node_config_str(items: dict) -> str:
    from flower_vfl.deploy.local import _node_config
    return _node_config(items)


#: the empty app's modes whose bytes are our round's: one N-vector down (v, alpha = 1) and one up
SAME_BYTES = "packed-v"
ALL_MODES = "tiny,payload,packed,packed-v,payload-state"


def _schedule(pairs: int, trees: int) -> list[tuple[int, int]]:
    """(pair, tree) in the order the jobs run: each pair runs every tree once, the order reversed
    every other pair (A B, B A, A B ...), each of our jobs followed by its own empty-app job."""
    out = []
    for i in range(pairs):
        order = list(range(trees)) if i % 2 == 0 else list(reversed(range(trees)))
        out += [(i, k) for k in order]
    return out


def _split_line(split: dict) -> str:
    keys = ("exchange", "central_compute", "party_compute", "party_process", "delivery", "return")
    return ", ".join(f"{k} {split[k]:.3f}" for k in keys if k in split)


def main(argv=None):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=2, help="(our job, empty app) pairs on the one deployment, per tree")
    ap.add_argument("--repeats", type=int, default=20, help="empty-app round trips per mode per job")
    ap.add_argument("--modes", default=ALL_MODES,
                    help=f"the empty app's modes (default {ALL_MODES}; {SAME_BYTES}: our round's bytes)")
    ap.add_argument("--idle-poll", type=float, default=0.5)
    ap.add_argument("--flower-pull", action="store_true", help="also the empty app with Flower's send_and_receive")
    ap.add_argument("--app-dir", action="append", default=None,
                    help="a flower-vfl tree whose app is submitted (default: this one). Repeat it to compare trees "
                         "on the one deployment: each pair runs every tree once, in alternated order, each job "
                         "followed by its own empty-app job (e.g. --app-dir /tmp/before --app-dir /tmp/after)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_real_nodes.json"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="time to a model at this relative objective gap (e.g. 1e-6): --rounds becomes the "
                         "rounds the same run takes in process to reach it, and each job reports the gap of "
                         "its last round and its wall time from `flwr run` to the finished status")
    ap.add_argument("--no-warm-server", action="store_true",
                    help="the SuperLink starts a new flwr-serverapp per run (Flower's subprocess isolation) instead "
                         "of forking it from flower-vfl's warm executor (deploy_local's warm_server)")
    args = ap.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in (args.app_dir or [str(ROOT)])]

    from flower_vfl.deploy.local import Processes, deploy_local, _flwr_json  # noqa: F401
    try:
        from flower_vfl.strategies.exchange import PULL_FIRST_S, PULL_MAX_S
    except ImportError:
        PULL_FIRST_S, PULL_MAX_S = 0.02, 0.25
    data_dir = str(Path(args.data_dir).resolve())
    f_star = None
    if args.gap:
        args.rounds, f_star = rounds_to_gap(args.gap, data_dir)
        print(f"in process: gap {args.gap:g} after {args.rounds} rounds (f* = {f_star:.12g})", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_real_nodes_"))
    timing = work / "timing.jsonl"
    from timing.flower_vfl_timing import enable   # benchmarks/timing/: the nodes' and forked tasks' lines
    enable(timing)                                 # ($FLOWER_VFL_TIMING, and its sitecustomize on PYTHONPATH)
    procs = Processes(work / "logs")
    nodes = {m: {"state-dir": str(work / f"party{m}-state"), "data-dir": data_dir} for m in range(2)}
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": args.rounds, "tol": 0.0, "data-dir": data_dir}
    ours, noop, loads = [], [], []
    t_start = time.time()
    schedule = _schedule(args.pairs, len(trees))
    try:
        env = None
        for j, (i, k) in enumerate(schedule):
            tree = trees[k]
            t0 = time.time()
            out = str(work / f"ours_{j}")
            if j == 0:                # the deployment, with our first job
                res = deploy_local(work, 2, {**rc, "out-dir": out}, node_configs=nodes,
                                   app_dir=tree, tls=True, auth=True, processes=procs, timeout=1800,
                                   isolation="warm", idle_poll=args.idle_poll,
                                   **({"warm_server": False} if args.no_warm_server else {}))
                env = dict(os.environ, FLWR_HOME=str(work / "flwr_home"),
                           FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
                env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
                r = {"exit_code": res["exit_code"], "wall_s": None, "t0": t0}
            else:
                r = {**run_job(procs, work, env, "loopback", Path(tree),
                               _node_config_str({**rc, "out-dir": out, "party-keys": str(work / "party-keys.json")}),
                               work / f"ours_{j}.log"), "t0": t0}
            rep = json.loads((Path(out) / "report.json").read_text())
            el = [x["elapsed_s"] for x in rep["rounds"]]
            split = split_rounds(_lines(timing, r["t0"]), args.rounds)
            tag = f"pair {i + 1} tree {k + 1}" if len(trees) > 1 else f"pair {i + 1}"
            ours.append({"pair": i, "tree": k, "app_dir": tree, "job": j,
                         "s_per_round": _med(np.diff(el[1:]).tolist()) if len(el) > 2 else float("nan"),
                         "rounds": len(el), "exit_code": r["exit_code"], "job_wall_s": r["wall_s"],
                         "round1_end_s": el[0], "split_s": split})
            if r.get("timeline_s"):
                ours[-1]["timeline_s"] = r["timeline_s"]
                print(f"{tag} ours, s after `flwr run` started: "
                      + ", ".join(f"{k_} {v:.2f}" for k_, v in r["timeline_s"].items() if v is not None), flush=True)
            if f_star is not None:
                ours[-1]["final_gap"] = (rep["rounds"][-1]["objective"] - f_star) / abs(f_star)
                print(f"{tag} ours: gap {ours[-1]['final_gap']:.3g} after {len(el)} rounds, "
                      f"`flwr run` -> finished {r['wall_s'] if r['wall_s'] is not None else float('nan'):.1f} s "
                      f"(round 1 ended {el[0]:.1f} s after the strategy started)", flush=True)
            loads.append(os.getloadavg()[0])
            ours[-1]["load_1min"] = loads[-1]
            print(f"{tag} ours ({tree}): {ours[-1]['s_per_round']:.3f} s/round over {len(el)} rounds "
                  f"(exit {r['exit_code']}; load {loads[-1]:.1f}); split {json.dumps({k_: round(v, 3) for k_, v in split.items()})}",
                  flush=True)
            pulls = [("ours", PULL_FIRST_S, PULL_MAX_S)] + ([("flower", 0.0, 0.0)] if args.flower_pull else [])
            for label, pf, pm in pulls:
                f = work / f"noop_{j}_{label}.json"
                r = run_job(procs, work, env, "loopback", NOOP_APP,
                            _node_config_str({"modes": args.modes, "repeats": args.repeats,
                                              "warmup": 2, "num-nodes": 2, "pull-first": pf, "pull-max": pm,
                                              "out-file": str(f)}), work / f"noop_{j}_{label}.log")
                if not f.exists():
                    raise RuntimeError(f"the empty app wrote no results (exit {r['exit_code']}); see {work}/logs")
                s = json.loads(f.read_text())
                noop.append({"pair": i, "tree": k, "job": j, "pull": label, "job_wall_s": r["wall_s"],
                             "round_trip_s": {m: {"median": v["total"]["median"], "mean": v["total"]["mean"]}
                                              for m, v in s["summary_s"].items()},
                             "parts_median_s": {m: {p: v[p]["median"] for p in ("delivery", "handling", "return")}
                                                for m, v in s["summary_s"].items()}})
                loads.append(os.getloadavg()[0])
                print(f"{tag} empty app ({label} pull): "
                      + ", ".join(f"{m} {v['median']:.3f}" for m, v in noop[-1]["round_trip_s"].items())
                      + f" s median (load {loads[-1]:.1f})", flush=True)
    finally:
        procs.stop_all()
        if not args.keep:
            import shutil
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    mine = {n["job"]: n for n in noop if n["pull"] == "ours"}
    modes = list(next(iter(mine.values()))["round_trip_s"])
    for o in ours:          # each of our jobs against the empty app that ran right after it
        o["ratio_to_empty_app"] = {m: o["s_per_round"] / mine[o["job"]]["round_trip_s"][m]["median"] for m in modes}
    per_tree = []
    for k, tree in enumerate(trees):
        jobs = [o for o in ours if o["tree"] == k]
        splits = [o["split_s"] for o in jobs if o["split_s"]]
        per_tree.append({
            "app_dir": tree, "s_per_round": [o["s_per_round"] for o in jobs],
            "ratio_to_empty_app": {m: [o["ratio_to_empty_app"][m] for o in jobs] for m in modes},
            "ratio_median": {m: _med([o["ratio_to_empty_app"][m] for o in jobs]) for m in modes},
            "split_median_s": {key: _med([sp[key] for sp in splits if key in sp])
                               for key in dict.fromkeys(x for sp in splits for x in sp)},
        })
    ratios = {m: [o["ratio_to_empty_app"][m] for o in ours] for m in modes}
    result = {
        "benchmark": "real nodes on loopback (TLS, registered keys, warm executor): s/round vs the empty app",
        "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "duration_s": time.time() - t_start,
        "gap": args.gap or None, "f_star": f_star,
        "config": {**rc, "idle_poll": args.idle_poll, "warm_server": not args.no_warm_server, "pull_first_s": PULL_FIRST_S, "pull_max_s": PULL_MAX_S,
                   "app_dir": trees[0] if len(trees) == 1 else trees, "modes": args.modes,
                   "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT")},
        "ours": ours, "empty_app": noop, "ratio_ours_over_empty_app_median": ratios, "per_tree": per_tree,
        "loadavg_1min": loads,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for k, t in enumerate(per_tree):
        name = f"tree {k + 1} ({t['app_dir']})" if len(trees) > 1 else "ours"
        print(f"{name}: s/round {[round(x, 3) for x in t['s_per_round']]}; ratio to the empty app (same pull): "
              + "; ".join(f"{m} {[round(x, 2) for x in v]} (median {t['ratio_median'][m]:.2f})"
                          for m, v in t["ratio_to_empty_app"].items()))
        if t["split_median_s"]:
            print(f"{name}: per-round split, median over its jobs of the medians over rounds 2..R (s): "
                  + _split_line(t["split_median_s"]))
    print(f"loads {[round(x, 1) for x in loads]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
