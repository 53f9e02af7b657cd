"""Flower simulation: seconds per ADMM round vs Flower's own round trip (issue #2).

One run of this script measures, on the same machine and in the same Flower simulation
engine (one SuperLink started here, Ray backend, 2 simulated SuperNodes):

1. our app (``flower_vfl.apps.server`` / ``client_app``) on a9a, paper split, default
   settings, ``--rounds`` ADMM rounds; seconds per round come from the per-round
   timestamps the strategy records (``elapsed_s`` in ``report.json``), rounds 2..R, so
   Ray start-up, data loading, the identify query and round 1 (actor spawn) are excluded;
2. Flower's own round trip with the minimal app in ``benchmarks/flower_noop``: one message
   to each of the 2 SuperNodes and wait for both replies, repeated; modes ``tiny`` (a
   scalar), ``payload`` (what our central node sends per round: two float64 N-vectors per
   party, N = 32561, and one N-vector back), ``payload-state`` (+ two N-vectors kept in
   ``context.state``) and ``payload-busy`` (+ the party spins for as long as our party's
   message handler takes in process, measured in step 3 of the same repetition);
3. in process, no Flower runtime: the engine ``flower_vfl.VerticalADMM`` and the same
   strategy + party handlers through ``flower_vfl.deploy.local_grid.LocalGrid``.

Each of ``--reps`` repetitions runs 3, 1, 2 in this order (the machine is noisy: the
ratios compare measurements taken side by side). Results:
``benchmarks/results/bench_flower.json``. The SuperLink and everything it started are
stopped at the end (also on errors / Ctrl-C).

Run from the repository root:  python benchmarks/bench_flower.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
NOOP_APP = Path(__file__).resolve().parent / "flower_noop"
RESULTS = Path(__file__).resolve().parent / "results"
#: the simulation's client-resources-num-cpus (--client-cpus; 0: Flower's default of 2)
CLIENT_CPUS = 0
A9A_DIR = Path(os.environ.get("A9A_DIR", "/work/shared/data/a9a"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------- processes
def _children(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), deepest last."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SuperLink:
    """A simulation-mode SuperLink of our own (own port, own FLWR_HOME), stopped by PID."""

    def __init__(self, workdir: Path, extra_env: dict | None = None):
        self.workdir = workdir
        self.home = workdir / "flwr_home"
        self.home.mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "127.0.0.1:{self.port}"\n'
            "insecure = true\n")
        # the apps look for a9a in <cwd>/../shared/data/a9a (flower_vfl.io.data.default_data_dir)
        self.cwd = workdir / "run" / "cwd"
        self.cwd.mkdir(parents=True)
        (workdir / "run" / "shared" / "data").mkdir(parents=True)
        os.symlink(A9A_DIR, workdir / "run" / "shared" / "data" / "a9a")
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        FLWR_DISABLE_UPDATE_CHECK="1", **(extra_env or {}))
        self.proc = None
        self.seen: set[int] = set()

    def start(self, timeout=60.0):
        cmd = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
               "--host", "127.0.0.1", "--port", str(self.port), "--database", str(self.workdir / "state.db"),
               "--log-file", str(self.workdir / "superlink.log"), "--disable-runtime-dependency-installation"]
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "superlink.err", "w"), start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"flower-superlink exited ({self.proc.returncode}); see {self.workdir}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("flower-superlink did not open its port")

    def flwr_run(self, app_dir: Path, run_config: str, log: Path, timeout=1200.0) -> float:
        fed = "num-supernodes=2" + (f" client-resources-num-cpus={CLIENT_CPUS}" if CLIENT_CPUS else "")
        cmd = ["flwr", "run", str(app_dir), "bench", "--stream", "--federation-config", fed,
               "--run-config", run_config]
        t = time.perf_counter()
        with open(log, "w") as fh:
            p = subprocess.Popen(cmd, cwd=app_dir, env=self.env, stdout=fh, stderr=subprocess.STDOUT)
            try:
                while p.poll() is None:   # note what the SuperLink starts (superexec, simulation, Ray)
                    self.seen.update(_children(self.proc.pid))
                    time.sleep(0.5)
                    if time.perf_counter() - t > timeout:
                        raise TimeoutError(f"flwr run {app_dir.name} took over {timeout} s")
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return time.perf_counter() - t

    def stop(self):
        """SIGTERM the SuperLink and every process it started (by PID), then SIGKILL stragglers."""
        if self.proc is None:
            return []
        pids = [self.proc.pid] + _children(self.proc.pid) + sorted(self.seen)
        pids = list(dict.fromkeys(p for p in pids if _alive(p)))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 10
            while time.time() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.2)
            pids = [p for p in pids if _alive(p)]
            if not pids:
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return pids   # survivors (should be empty)


# ------------------------------------------------------------- measurements
def in_process(rounds: int):
    """Engine and LocalGrid seconds per round (rounds 2..R), and the party's train-handler time."""
    from flower_vfl import VerticalADMM
    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.deploy.local_grid import LocalGrid

    dd = str(A9A_DIR)
    blocks = [party_block("a9a", m, 2, dd)[0] for m in range(2)]
    y, _ = labels("a9a", dd)

    m = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0).fit(blocks, y)
    e = [h["elapsed_s"] for h in m.history_]
    engine = (e[-1] - e[0]) / (len(e) - 1)

    handler_s = []

    def timed_train(msg, ctx):
        t = time.perf_counter()
        rep = ca.train(msg, ctx)
        handler_s.append(time.perf_counter() - t)
        return rep

    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": rounds, "data-dir": dd}
    grid = LocalGrid({"train": timed_train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                     {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    st = sa.make_strategy(rc)
    st.start(grid)
    e = [h["elapsed_s"] for h in st.history_]
    local = (e[-1] - e[0]) / (len(e) - 1)
    return {"engine_s_per_round": engine, "localgrid_s_per_round": local,
            "party_train_handler_s": {"mean": float(np.mean(handler_s[2:])),
                                      "median": float(np.median(handler_s[2:]))},
            "rounds": rounds}


def run_ours(link: SuperLink, rounds: int, out: Path):
    wall = link.flwr_run(REPO, f"dataset='a9a' num-parties=2 max-rounds={rounds} out-dir='{out}'",
                         out.with_suffix(".log"))
    path = out / "report.json"
    if not path.exists():
        raise RuntimeError(f"our app wrote no report; see {out.with_suffix('.log')}:\n"
                           + out.with_suffix(".log").read_text()[-3000:])
    rep = json.loads(path.read_text())
    e = [r["elapsed_s"] for r in rep["rounds"]]
    assert len(e) == rounds, (len(e), rounds)
    return {"flwr_run_wall_s": wall, "round1_end_s": e[0], "per_round_s": list(np.diff(e)),
            "test_accuracy": rep["final"].get("test_accuracy")}


def run_noop(link: SuperLink, repeats: int, busy: float, out: Path):
    wall = link.flwr_run(NOOP_APP, f"repeats={repeats} busy-s={busy} out-file='{out}'",
                         out.with_suffix(".log"))
    if not out.exists():
        raise RuntimeError(f"the round-trip app wrote no results; see {out.with_suffix('.log')}:\n"
                           + out.with_suffix(".log").read_text()[-3000:])
    res = json.loads(out.read_text())
    res["flwr_run_wall_s"] = wall
    return res


def stats(v):
    v = np.asarray(v, dtype=float)
    return {"mean": float(v.mean()), "median": float(np.median(v)), "min": float(v.min()),
            "max": float(v.max()), "n": int(v.size)}


def machine():
    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import flwr
    import ray
    import scipy
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "numpy": np.__version__, "scipy": scipy.__version__, "flwr": flwr.__version__,
            "ray": ray.__version__}


def git_state():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "flower_vfl", "pyproject.toml"], cwd=REPO,
                               capture_output=True, text=True).stdout.split("\n")
        return {"head": head, "flower_vfl_uncommitted": [d.strip() for d in dirty if d.strip()]}
    except OSError:
        return {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="ADMM rounds per run of our app")
    ap.add_argument("--repeats", type=int, default=30, help="round trips per mode per run of the no-op app")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of (in process, our app, no-op app)")
    ap.add_argument("--out", default=str(RESULTS / "bench_flower.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary run directory (logs)")
    ap.add_argument("--no-wake-arm", action="store_true",
                    help="also run our app on a second SuperLink with $FLOWER_VFL_SIM_WAKE=0 (the central node "
                         "leaves each round to Flower's 0.1 s delivery tick), in every repetition")
    ap.add_argument("--client-cpus", type=int, default=0,
                    help="the simulation's client-resources-num-cpus for both apps (0: Flower's default, 2: "
                         "one Ray actor on 2 cores runs the two parties one after the other; 1: two actors)")
    args = ap.parse_args(argv)
    global CLIENT_CPUS
    CLIENT_CPUS = args.client_cpus
    if shutil.which("flwr") is None or shutil.which("flower-superlink") is None:
        sys.exit("the flwr CLI is not on PATH")
    if not (A9A_DIR / "a9a").is_file():
        sys.exit(f"a9a not found in {A9A_DIR} (set A9A_DIR)")

    t_start, git = time.time(), git_state()
    work = Path(tempfile.mkdtemp(prefix="bench_flower_"))
    link = SuperLink(work)
    nowake = SuperLink(work / "nowake", {"FLOWER_VFL_SIM_WAKE": "0"}) if args.no_wake_arm else None
    ours, ours_nowake, noop, inproc, load = [], [], [], [], []
    survivors = None
    try:
        link.start()
        if nowake is not None:
            nowake.start()
        for r in range(args.reps):
            load.append(os.getloadavg()[0])
            print(f"rep {r + 1}/{args.reps}: in process ...", flush=True)
            inproc.append(in_process(args.rounds))
            print("  " + json.dumps(inproc[-1]), flush=True)
            print(f"rep {r + 1}/{args.reps}: our app in Flower simulation, {args.rounds} rounds ...", flush=True)
            ours.append(run_ours(link, args.rounds, work / f"ours_{r}"))
            print(f"  {np.mean(ours[-1]['per_round_s']):.3f} s/round", flush=True)
            if nowake is not None:
                print(f"rep {r + 1}/{args.reps}: our app, wake off ($FLOWER_VFL_SIM_WAKE=0) ...", flush=True)
                ours_nowake.append(run_ours(nowake, args.rounds, work / f"ours_nowake_{r}"))
                print(f"  {np.mean(ours_nowake[-1]['per_round_s']):.3f} s/round", flush=True)
            busy = round(inproc[-1]["party_train_handler_s"]["median"], 4)
            print(f"rep {r + 1}/{args.reps}: round-trip app, {args.repeats} per mode, busy-s={busy} ...", flush=True)
            noop.append(run_noop(link, args.repeats, busy, work / f"noop_{r}.json"))
            print("  " + json.dumps({m: round(s["total"]["mean"], 3) for m, s in noop[-1]["summary_s"].items()}),
                  flush=True)
        load.append(os.getloadavg()[0])
    finally:
        survivors = link.stop() + (nowake.stop() if nowake is not None else [])
        if survivors:
            print(f"WARNING: processes still alive after stop: {survivors}", file=sys.stderr)
        if args.keep:
            print(f"run directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    per_round = [x for o in ours for x in o["per_round_s"]]
    modes = list(noop[0]["summary_s"])
    rt = {m: {part: stats([t[part] for n in noop for t in n["round_trips_s"][m]])
              for part in ("total", "delivery", "handling", "return")} for m in modes}
    ours_mean = float(np.mean(per_round))
    engine = stats([i["engine_s_per_round"] for i in inproc])
    local = stats([i["localgrid_s_per_round"] for i in inproc])
    handler = stats([i["party_train_handler_s"]["median"] for i in inproc])
    result = {
        "benchmark": "Flower simulation seconds per ADMM round vs Flower's own round trip",
        "command": "python benchmarks/bench_flower.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                          if (argv if argv is not None else sys.argv[1:]) else ""),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "duration_s": time.time() - t_start,
        "machine": machine(), "git": git,
        "setup": {"dataset": "a9a", "split": "paper (66 + 57 columns)", "supernodes": 2, "N": 32561,
                  "rounds_per_run": args.rounds, "round_trips_per_mode_per_run": args.repeats,
                  "reps": args.reps, "busy_s_per_rep": [n["busy_s"] for n in noop],
                  "loadavg_1min_at_rep_starts_and_end": load,
                  "flower_sim": "flwr run (Ray backend) on a SuperLink started with --simulation; "
                                "per-round times from report.json elapsed_s, rounds 2..R"},
        "ours_flower_sim_s_per_round": stats(per_round),
        "ours_flower_sim_runs": [{"mean_s_per_round": float(np.mean(o["per_round_s"])), **{k: v for k, v in o.items()
                                  if k != "per_round_s"}} for o in ours],
        "flower_round_trip_s": rt,
        "flower_round_trip_runs": [{m: n["summary_s"][m]["total"]["mean"] for m in modes} |
                                   {"flwr_run_wall_s": n["flwr_run_wall_s"]} for n in noop],
        "in_process": {"engine_s_per_round": engine, "localgrid_s_per_round": local,
                       "party_train_handler_s_median": handler, "runs": inproc},
        "ratios_mean": {f"ours / {m}": ours_mean / rt[m]["total"]["mean"] for m in modes}
                       | {"ours / engine": ours_mean / engine["mean"],
                          "ours / localgrid": ours_mean / local["mean"]},
        "ratios_median": {f"ours / {m}": float(np.median(per_round)) / rt[m]["total"]["median"] for m in modes},
        "processes_left": survivors or [],
    }
    if ours_nowake:
        off = [x for o in ours_nowake for x in o["per_round_s"]]
        result["ours_wake_off_s_per_round"] = stats(off)
        result["ours_wake_off_runs"] = [{"mean_s_per_round": float(np.mean(o["per_round_s"])),
                                         **{k: v for k, v in o.items() if k != "per_round_s"}} for o in ours_nowake]
        result["ratios_mean"] |= {f"ours wake off / {m}": float(np.mean(off)) / rt[m]["total"]["mean"] for m in modes}
        result["ratios_median"] |= {f"ours wake off / {m}": float(np.median(off)) / rt[m]["total"]["median"]
                                    for m in modes}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("ours_flower_sim_s_per_round", "ours_wake_off_s_per_round",
                                             "ratios_mean", "ratios_median") if k in result},
                     indent=1))
    print({m: round(rt[m]["total"]["mean"], 4) for m in modes})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
