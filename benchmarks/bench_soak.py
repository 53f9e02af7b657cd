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
    python -W ignore benchmarks/bench_soak.py soak --parties 8 --rounds 200 --warmup 20 --out benchmarks/results/soak_8.json
    python -W ignore benchmarks/bench_soak.py summarize --out benchmarks/results/soak_8.json --warmup 20 [--rounds R]

Each sample also has PSS (``smaps_rollup``; shared pages split between the processes sharing them):
the sum of RSS counts a library page, or a page a forked ClientApp shares with its executor, once
per process. The ServerApp and the SuperExec Flower starts for it run in a session of their own:
they are found as descendants of the SuperLink. Writes benchmarks/results/soak_<mode>.json (``--out``);
a soak also writes the series as CSV (one row per process and sample) and a PNG of it;
``summarize`` reads that CSV again (the samples while the ServerApp ran, up to round ``--rounds``:
a run stopped by hand with ``flwr stop``) into ``<out>_summary.json`` and redraws the PNG.
Every process is started in its own session and stopped by its process group at the end.
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


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process on the machine."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                out[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _proc(pid: int) -> dict | None:
    """RSS and PSS (MB), threads, fds and a short command line of one process (None when gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:")), 0) / 1024
        hwm = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0) / 1024
        threads = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("Threads:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        try:                             # proportional set size: shared pages split between sharers
            roll = Path(f"/proc/{pid}/smaps_rollup").read_text()
            pss = next(int(x.split()[1]) for x in roll.splitlines() if x.startswith("Pss:")) / 1024
        except (OSError, StopIteration):
            pss = rss
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return {"rss_mb": rss, "hwm_mb": hwm, "pss_mb": pss, "threads": threads, "fds": fds,
                "cmd": " ".join(c.decode(errors="replace") for c in cmd[:4])[:160]}
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def sample(procs) -> dict:
    """One sample of every process started here and of all their descendants (Flower's SuperLink
    starts its SuperExec, hence the ServerApp, in a session of its own; a warm executor forks one
    ClientApp per message): role -> stats, the forked ClientApps counted apart (count, summed)."""
    leaders = {p.pid: name for name, p in procs.procs.items()}
    parent = _ppids()
    out, forked = {}, {"n": 0, "rss_mb": 0.0, "pss_mb": 0.0}
    for pid in parent:
        leader, q, seen = None, pid, 0
        while q > 1 and seen < 64:              # the nearest ancestor (or itself) started here
            if q in leaders:
                leader = leaders[q]
                break
            q, seen = parent.get(q, 0), seen + 1
        if leader is None:
            continue
        info = _proc(pid)
        if info is None:
            continue
        c = info["cmd"]
        if pid in leaders:
            role = leaders[pid]
        elif "flwr-serverapp" in c:
            role = "serverapp"
        elif "flower-superexec" in c:
            role = f"superexec({leader})"
        elif leader.startswith("exec"):
            forked["n"] += 1                     # a forked ClientApp (one per message)
            forked["rss_mb"] += info["rss_mb"]
            forked["pss_mb"] += info["pss_mb"]
            # per executor: the largest peak RSS (VmHWM) of its ClientApps alive at this sample
            mine = forked.setdefault("hwm_mb_by_exec", {})
            mine[leader] = max(mine.get(leader, 0.0), info["hwm_mb"])
            continue
        else:
            role = f"child({leader})"
        if role in out:                          # two of one kind: keep them apart
            role = f"{role}#{pid}"
        out[role] = {k: info[k] for k in ("rss_mb", "hwm_mb", "pss_mb", "threads", "fds")} | {"pid": pid}
    return {"t": time.time(), "procs": out, "forked": forked,
            "total_rss_mb": sum(v["rss_mb"] for v in out.values()) + forked["rss_mb"],
            "total_pss_mb": sum(v["pss_mb"] for v in out.values()) + forked["pss_mb"]}


def rounds_done(out_dir: Path) -> list[float]:
    try:
        return [r["elapsed_s"] for r in json.loads((out_dir / "report.json").read_text())["rounds"]]
    except (OSError, ValueError, KeyError):
        return []


def sampled_run(job, sample, procs, out: Path, every: float):
    """Run ``job()`` (a deployment) in a thread and call ``sample()`` every ``every`` s while it
    runs, each sample tagged with the rounds done so far (report.json in ``out``); stop ``procs``
    after. Returns (samples, each round's elapsed_s, the gaps of rounds 2..R, the start time)."""
    th = threading.Thread(target=job, daemon=True)
    samples = []
    t0 = time.time()
    th.start()
    try:
        while th.is_alive():
            s = sample()
            s["round"] = len(rounds_done(out))
            samples.append(s)
            th.join(every)
    finally:
        th.join(60)
        procs.stop_all()
    el = rounds_done(out)
    return samples, el, [b - a for a, b in zip(el[1:], el[2:])] if len(el) > 2 else [], t0


def deploy_job(work: Path, parties: int, rc: dict, nodes: dict, procs, res: dict):
    """The deployment (``deploy_local``: loopback, warm executor) as :func:`sampled_run`'s job:
    its result, or its error as ``res['error']``, goes into ``res``."""
    from flower_vfl.deploy.local import deploy_local

    def job():
        try:
            res.update(deploy_local(work, parties, rc, node_configs=nodes, processes=procs, timeout=7200,
                                    isolation="warm", app_dir=str(ROOT)))
        except Exception as exc:         # reported by the caller
            res["error"] = f"{type(exc).__name__}: {exc}"
    return job


def run_job(work: Path, parties: int, rounds: int, data_dir: str, every: float) -> dict:
    from flower_vfl.deploy.local import Processes
    procs = Processes(work / "logs")
    out = work / "out"
    nodes = {m: {"state-dir": str(work / f"party{m}-state"), "data-dir": data_dir} for m in range(parties)}
    rc = {"dataset": "a9a", "num-parties": parties, "max-rounds": rounds, "tol": 0.0, "data-dir": data_dir,
          "out-dir": str(out)}
    res: dict = {}
    job = deploy_job(work, parties, rc, nodes, procs, res)
    loads = []

    def one():
        loads.append(os.getloadavg()[0])
        return sample(procs)
    samples, el, diffs, t0 = sampled_run(job, one, procs, out, every)
    return {"parties": parties, "rounds": len(el), "exit_code": res.get("exit_code"), "error": res.get("error"),
            "wall_s": time.time() - t0, "s_per_round": statistics.median(diffs) if diffs else None,
            "round1_end_s": el[0] if el else None, "elapsed_s": el, "samples": samples,
            "load_mean": statistics.fmean(loads) if loads else None,
            "load_max": max(loads) if loads else None}


def _kind(role: str) -> str:
    """superlink / central (the ServerApp and Flower's SuperExec the SuperLink starts) / node / exec:
    the kinds the per-process figures are summed over at a sample."""
    if role.startswith("superlink"):
        return "superlink"
    if role.startswith(("serverapp", "superexec(superlink", "child(superlink")):
        return "central"
    if role.startswith(("node", "superexec(node", "child(node")):
        return "node"
    if role.startswith(("exec", "superexec(exec")):
        return "exec"
    return "other"


def by_kind(s: dict, key: str) -> dict:
    out: dict = {}
    for role, v in s["procs"].items():
        out[_kind(role)] = out.get(_kind(role), 0.0) + v[key]
    out["forked"] = s["forked"][key]
    return {k: round(v, 1) for k, v in out.items()}


def scale(args, data_dir) -> dict:
    rows = []
    for m in [int(x) for x in args.parties.split(",")]:
        work = Path(tempfile.mkdtemp(prefix=f"bench_soak_scale{m}_"))
        r = run_job(work, m, args.rounds, data_dir, args.every)
        row = {k: r[k] for k in ("parties", "rounds", "exit_code", "error", "wall_s", "s_per_round",
                                 "round1_end_s", "elapsed_s", "load_mean", "load_max")}
        for key in ("rss_mb", "pss_mb"):
            if r["samples"]:
                at_peak = max(r["samples"], key=lambda s: s[f"total_{key}"])
                row[f"peak_total_{key}"] = at_peak[f"total_{key}"]
                row[f"at_peak_{key}_by_kind"] = by_kind(at_peak, key)
                row[f"at_peak_{key}"] = {k: round(v[key], 1) for k, v in at_peak["procs"].items()} | \
                    {"forked": at_peak["forked"]}
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("parties", "rounds", "exit_code", "error", "s_per_round",
                                                  "peak_total_rss_mb", "peak_total_pss_mb", "at_peak_pss_mb_by_kind",
                                                  "at_peak_rss_mb_by_kind", "load_mean")}), flush=True)
        if not args.keep:
            import shutil
            shutil.rmtree(work, ignore_errors=True)
    return {"mode": "scale", "rows": rows}


def soak(args, data_dir) -> dict:
    m = int(args.parties)
    work = Path(tempfile.mkdtemp(prefix=f"bench_soak_{m}_"))
    r = run_job(work, m, args.rounds, data_dir, args.every)
    samples = r.pop("samples")
    r["series"] = samples                # written as CSV by main(), one row per process and sample
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


def write_series(samples, path: Path) -> None:
    """One row per process and sample: t (s from the first sample), round, role, rss_mb, pss_mb,
    threads, fds; the forked ClientApps of a sample as role 'forked' (threads = their count)."""
    import csv
    t0 = samples[0]["t"] if samples else 0.0
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "round", "role", "pid", "rss_mb", "pss_mb", "threads", "fds"])
        for s in samples:
            for role, v in sorted(s["procs"].items()):
                w.writerow([f"{s['t'] - t0:.1f}", s["round"], role, v["pid"], f"{v['rss_mb']:.1f}",
                            f"{v['pss_mb']:.1f}", v["threads"], v["fds"]])
            f = s["forked"]
            w.writerow([f"{s['t'] - t0:.1f}", s["round"], "forked", "", f"{f['rss_mb']:.1f}", f"{f['pss_mb']:.1f}",
                        f["n"], ""])
    print(f"wrote {path}")


def plot_series(csv_path: Path, png: Path, warmup: int = 20) -> None:
    """RSS per long-lived process against the round (one line each), the forked ClientApps' summed
    RSS (those alive at each sample), threads and open fds per long-lived process below."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(csv_path)))
    roles = sorted({r["role"] for r in rows} - {"forked"}, key=lambda x: (x.rstrip("0123456789"), len(x), x))
    fig, (ax, axf, ax2, ax3) = plt.subplots(4, 1, figsize=(10, 11), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 1.2, 1, 1]})
    cmap = plt.get_cmap("tab20")
    for i, role in enumerate(roles):
        pts = [(int(r["round"]), float(r["rss_mb"]), int(r["threads"]), int(r["fds"])) for r in rows
               if r["role"] == role]
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], lw=1, color=cmap(i % 20), label=role)
        ax2.plot(x, [p[2] for p in pts], lw=1, color=cmap(i % 20))
        ax3.plot(x, [p[3] for p in pts], lw=1, color=cmap(i % 20))
    fk = [(int(r["round"]), float(r["rss_mb"]), float(r["pss_mb"])) for r in rows if r["role"] == "forked"]
    axf.plot([p[0] for p in fk], [p[1] for p in fk], ".", ms=2, color="tab:orange", label="RSS")
    axf.plot([p[0] for p in fk], [p[2] for p in fk], ".", ms=2, color="tab:blue", label="PSS")
    for a in (ax, axf, ax2, ax3):
        a.axvline(warmup, color="grey", lw=0.8, ls=":")
        a.grid(alpha=0.3)
    ax.set_ylabel("RSS (MB)")
    axf.set_ylabel("forked ClientApps\nsummed (MB)")
    axf.legend(fontsize=7, loc="upper left")
    ax2.set_ylabel("threads")
    ax3.set_ylabel("open fds")
    ax3.set_xlabel("rounds completed (report.json)")
    ax.legend(fontsize=7, ncol=5, loc="upper left")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Soak on loopback real nodes: RSS per process ({csv_path.name}); dotted: end of warm-up")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def summarize_csv(csv_path: Path, warmup: int, end_round: int | None = None) -> dict:
    """From a soak's CSV: per long-lived process, RSS / PSS / threads / fds at the first sample
    after ``warmup`` rounds and at the last sample while the run was going (the ServerApp alive),
    the change of RSS in %, the largest values after warm-up; the total PSS likewise. ``end_round``:
    only samples up to that round (e.g. before a run was stopped by hand)."""
    import csv
    rows = list(csv.DictReader(open(csv_path)))
    by_t: dict = {}
    for r in rows:
        by_t.setdefault(float(r["t_s"]), {})[r["role"]] = r
    times = sorted(by_t)
    live = [t for t in times if "serverapp" in by_t[t] and int(next(iter(by_t[t].values()))["round"]) >= warmup
            and (end_round is None or int(next(iter(by_t[t].values()))["round"]) <= end_round)]
    if not live:
        return {}
    t0, t1 = live[0], live[-1]
    per = {}
    for role, a in sorted(by_t[t0].items()):
        if role == "forked" or role not in by_t[t1]:
            continue
        b = by_t[t1][role]
        series = [by_t[t][role] for t in live if role in by_t[t]]
        per[role] = {"rss_mb_warm": float(a["rss_mb"]), "rss_mb_end": float(b["rss_mb"]),
                     "rss_change_pct": round(100 * (float(b["rss_mb"]) - float(a["rss_mb"])) / float(a["rss_mb"]), 1),
                     "rss_max_after_warm": max(float(x["rss_mb"]) for x in series),
                     "pss_mb_warm": float(a["pss_mb"]), "pss_mb_end": float(b["pss_mb"]),
                     "threads_warm": int(a["threads"]), "threads_end": int(b["threads"]),
                     "threads_max_after_warm": max(int(x["threads"]) for x in series),
                     "fds_warm": int(a["fds"]), "fds_end": int(b["fds"]),
                     "fds_max_after_warm": max(int(x["fds"]) for x in series)}
    tot = {t: sum(float(r["pss_mb"]) for r in by_t[t].values()) for t in live}
    totr = {t: sum(float(r["rss_mb"]) for r in by_t[t].values()) for t in live}
    # the long-lived processes only (the forked ClientApps alive at a sample vary from 0 to M)
    lived = {t: sum(float(r["pss_mb"]) for k, r in by_t[t].items() if k != "forked") for t in live}
    return {"warmup": warmup, "warm_round": int(by_t[t0]["serverapp"]["round"]),
            "end_round": int(by_t[t1]["serverapp"]["round"]), "warm_t_s": t0, "end_t_s": t1,
            "total_pss_mb": {"warm": tot[t0], "end": tot[t1], "max_after_warm": max(tot.values())},
            "total_rss_mb": {"warm": totr[t0], "end": totr[t1], "max_after_warm": max(totr.values())},
            "long_lived_pss_mb": {"warm": lived[t0], "end": lived[t1], "max_after_warm": max(lived.values()),
                                  "min_after_warm": min(lived.values())},
            "per_process": per}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("scale", "soak", "summarize"))
    ap.add_argument("--parties", default=None, help="scale: a list (2,16); soak: one number (8)")
    ap.add_argument("--rounds", type=int, default=None, help="scale: 10; soak: 200")
    ap.add_argument("--warmup", type=int, default=20, help="soak: rounds before the reference sample")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--src", default=None,
                    help="another copy of the flower_vfl package (its parent folder) for deploy-local and the "
                         "processes it starts (a baseline); the ClientApp/ServerApp code is the checkout's bundle")
    args = ap.parse_args(argv)
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(args.src).resolve()), os.environ.get("PYTHONPATH", "")])
    if args.parties is None:
        args.parties = "2,16" if args.mode == "scale" else "8"
    if args.rounds is None:
        args.rounds = 10 if args.mode == "scale" else 200
    if args.mode == "summarize":          # a soak's CSV (--out: its .json name) -> table, _summary.json, PNG
        out = Path(args.out or Path(__file__).parent / "results" / "soak_soak.json")
        summ = summarize_csv(out.with_suffix(".csv"), args.warmup, args.rounds)
        for role, v in summ.get("per_process", {}).items():
            print(f"{role:24s} RSS {v['rss_mb_warm']:7.1f} -> {v['rss_mb_end']:7.1f} MB ({v['rss_change_pct']:+5.1f} %, "
                  f"max {v['rss_max_after_warm']:7.1f}), threads {v['threads_warm']} -> {v['threads_end']} "
                  f"(max {v['threads_max_after_warm']}), fds {v['fds_warm']} -> {v['fds_end']} (max {v['fds_max_after_warm']})")
        path = out.with_name(out.stem + "_summary.json")
        path.write_text(json.dumps(summ, indent=1))
        plot_series(out.with_suffix(".csv"), out.with_suffix(".png"), warmup=args.warmup)
        print(f"wrote {path}")
        return
    data_dir = str(Path(args.data_dir).resolve())
    out = Path(args.out or Path(__file__).parent / "results" / f"soak_{args.mode}.json")
    result = (scale if args.mode == "scale" else soak)(args, data_dir)
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    result["command"] = " ".join(["python -W ignore benchmarks/bench_soak.py", *(argv or sys.argv[1:])])
    import flower_vfl.deploy.local as used
    result["deploy_local_from"] = used.__file__
    series = result.pop("series", None)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    if series:
        write_series(series, out.with_suffix(".csv"))
        plot_series(out.with_suffix(".csv"), out.with_suffix(".png"), warmup=args.warmup)


if __name__ == "__main__":
    main()
