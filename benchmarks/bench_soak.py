"""Soak and scale on real Flower nodes (issue 23.5): reported, not asserted.

One deployment per job (``flower_vfl.deploy.local.deploy_local``: a SuperLink and M SuperNodes on
loopback, TLS with a generated CA, SuperNode keys registered and bound to parties, the warm
executor, ``flower-vfl-supernode``), a9a with the paper split into M parties, ``tol`` 0 (every
round runs). While the job runs, every process of every process group it started (the SuperLink
and the ServerApp it spawns, each SuperNode, each warm executor and the ClientApp processes it
forks) is sampled every ``--every`` s from /proc: RSS (VmRSS), threads, open file descriptors.

- ``scale``: for each M in ``--parties`` (default 2,16), ``--rounds`` rounds: s/round (median of
  the differences of report.json's ``elapsed_s`` over rounds 2..R) and the peak over samples of
  the summed RSS of all processes;
- ``soak``: M = ``--parties`` (default 8), ``--rounds`` (default 200): per long-lived process
  (SuperLink, ServerApp, SuperNodes, executors) RSS / threads / fds at the end of round
  ``--warmup`` (default 20) and at the last sample, the change in %, and the largest value after
  warm-up; the forked ClientApp processes (short-lived) as a count and summed RSS per sample.

    python -W ignore benchmarks/bench_soak.py scale --parties 2,16 --rounds 10
    python -W ignore benchmarks/bench_soak.py soak --parties 8 --rounds 200 --warmup 20

Writes benchmarks/results/bench_soak_<mode>.json. Every process is started in its own session and
stopped by its process group at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc(pid: int) -> dict | None:
    """pgid, RSS (MB), threads, fds and a short name of one process (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        pgid = int(fields[2])
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:")), 0) / 1024
        threads = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("Threads:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return {"pgid": pgid, "rss_mb": rss, "threads": threads, "fds": fds,
                "cmd": " ".join(c.decode(errors="replace") for c in cmd[:4])[:120]}
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def _role(pid, info, leaders) -> str:
    """A stable name: the group leader's name from Processes, or a name from the command line."""
    if pid in leaders:
        return leaders[pid]
    c = info["cmd"]
    if "flwr-serverapp" in c or "serverapp" in c:
        return "serverapp"
    if "superexec" in c:
        return f"superexec({leaders.get(info['pgid'], info['pgid'])})"
    return f"child({leaders.get(info['pgid'], info['pgid'])})"


def sample(procs) -> dict:
    """One sample of every process in the groups ``procs`` started: role -> stats, plus the
    short-lived ClientApp processes (children of the executors) counted apart."""
    groups = set(procs.started)
    leaders = {p.pid: name for name, p in procs.procs.items()}
    out, forked = {}, {"n": 0, "rss_mb": 0.0}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        info = _proc(pid)
        if info is None or info["pgid"] not in groups:
            continue
        role = _role(pid, info, leaders)
        group_name = leaders.get(info["pgid"], "")
        if role.startswith("child(") and group_name.startswith("exec"):
            forked["n"] += 1                     # a forked ClientApp (one per message)
            forked["rss_mb"] += info["rss_mb"]
            continue
        if role in out:                          # two of one kind: keep them apart
            role = f"{role}#{pid}"
        out[role] = {k: info[k] for k in ("rss_mb", "threads", "fds")} | {"pid": pid}
    return {"t": time.time(), "procs": out, "forked": forked,
            "total_rss_mb": sum(v["rss_mb"] for v in out.values()) + forked["rss_mb"]}


def rounds_done(out_dir: Path) -> list[float]:
    try:
        return [r["elapsed_s"] for r in json.loads((out_dir / "report.json").read_text())["rounds"]]
    except (OSError, ValueError, KeyError):
        return []


def run_job(work: Path, parties: int, rounds: int, data_dir: str, every: float) -> dict:
    from flower_vfl.deploy.local import Processes, deploy_local
    procs = Processes(work / "logs")
    out = work / "out"
    nodes = {m: {"state-dir": str(work / f"party{m}-state"), "data-dir": data_dir} for m in range(parties)}
    rc = {"dataset": "a9a", "num-parties": parties, "max-rounds": rounds, "tol": 0.0, "data-dir": data_dir,
          "out-dir": str(out)}
    res: dict = {}

    def job():
        try:
            res.update(deploy_local(work, parties, rc, node_configs=nodes, processes=procs, timeout=7200,
                                    isolation="warm", app_dir=str(ROOT)))
        except Exception as exc:         # reported below
            res["error"] = f"{type(exc).__name__}: {exc}"
    th = threading.Thread(target=job, daemon=True)
    samples, loads = [], []
    t0 = time.time()
    th.start()
    try:
        while th.is_alive():
            s = sample(procs)
            s["round"] = len(rounds_done(out))
            samples.append(s)
            loads.append(os.getloadavg()[0])
            th.join(every)
    finally:
        th.join(60)
        procs.stop_all()
    el = rounds_done(out)
    diffs = [b - a for a, b in zip(el[1:], el[2:])] if len(el) > 2 else []
    return {"parties": parties, "rounds": len(el), "exit_code": res.get("exit_code"), "error": res.get("error"),
            "wall_s": time.time() - t0, "s_per_round": statistics.median(diffs) if diffs else None,
            "round1_end_s": el[0] if el else None, "elapsed_s": el, "samples": samples,
            "load_mean": statistics.fmean(loads) if loads else None,
            "load_max": max(loads) if loads else None}


def scale(args, data_dir) -> dict:
    rows = []
    for m in [int(x) for x in args.parties.split(",")]:
        work = Path(tempfile.mkdtemp(prefix=f"bench_soak_scale{m}_"))
        r = run_job(work, m, args.rounds, data_dir, args.every)
        peak = max((s["total_rss_mb"] for s in r["samples"]), default=0.0)
        row = {k: r[k] for k in ("parties", "rounds", "exit_code", "error", "wall_s", "s_per_round",
                                 "round1_end_s", "load_mean", "load_max")} | {"peak_total_rss_mb": peak}
        at_peak = max(r["samples"], key=lambda s: s["total_rss_mb"]) if r["samples"] else None
        if at_peak:
            row["at_peak"] = {k: round(v["rss_mb"], 1) for k, v in at_peak["procs"].items()} | \
                {"forked": at_peak["forked"]}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("parties", "rounds", "exit_code", "s_per_round", "peak_total_rss_mb",
                                              "load_mean")}), flush=True)
        if not args.keep:
            import shutil
            shutil.rmtree(work, ignore_errors=True)
    return {"mode": "scale", "rows": rows}


def soak(args, data_dir) -> dict:
    m = int(args.parties)
    work = Path(tempfile.mkdtemp(prefix=f"bench_soak_{m}_"))
    r = run_job(work, m, args.rounds, data_dir, args.every)
    samples = r.pop("samples")
    after = [s for s in samples if s["round"] >= args.warmup]
    per = {}
    if after:
        first, last = after[0], after[-1]
        for role, v in first["procs"].items():
            series = [s["procs"][role] for s in after if role in s["procs"]]
            if role not in last["procs"]:
                continue
            e = last["procs"][role]
            per[role] = {
                f"{k}_warm": v[k] for k in ("rss_mb", "threads", "fds")} | {
                f"{k}_end": e[k] for k in ("rss_mb", "threads", "fds")} | {
                "rss_change_pct": 100.0 * (e["rss_mb"] - v["rss_mb"]) / max(v["rss_mb"], 1e-9),
                "rss_max_after_warm": max(x["rss_mb"] for x in series),
                "threads_max_after_warm": max(x["threads"] for x in series),
                "fds_max_after_warm": max(x["fds"] for x in series)}
        forked = [s["forked"]["n"] for s in after]
        r["forked_per_sample"] = {"max": max(forked), "mean": statistics.fmean(forked)}
        r["total_rss_mb"] = {"warm": first["total_rss_mb"], "end": last["total_rss_mb"],
                             "max_after_warm": max(s["total_rss_mb"] for s in after)}
        r["warm_round"], r["end_round"] = first["round"], last["round"]
    r["per_process"] = per
    for role, v in sorted(per.items()):
        print(f"{role:28s} RSS {v['rss_mb_warm']:8.1f} -> {v['rss_mb_end']:8.1f} MB ({v['rss_change_pct']:+.1f} %), "
              f"threads {v['threads_warm']} -> {v['threads_end']}, fds {v['fds_warm']} -> {v['fds_end']}", flush=True)
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return {"mode": "soak", "warmup": args.warmup, **r}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("scale", "soak"))
    ap.add_argument("--parties", default=None, help="scale: a list (2,16); soak: one number (8)")
    ap.add_argument("--rounds", type=int, default=None, help="scale: 10; soak: 200")
    ap.add_argument("--warmup", type=int, default=20, help="soak: rounds before the reference sample")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    if args.parties is None:
        args.parties = "2,16" if args.mode == "scale" else "8"
    if args.rounds is None:
        args.rounds = 10 if args.mode == "scale" else 200
    data_dir = str(Path(args.data_dir).resolve())
    result = (scale if args.mode == "scale" else soak)(args, data_dir)
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out = Path(args.out or Path(__file__).parent / "results" / f"bench_soak_{args.mode}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
