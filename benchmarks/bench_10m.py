"""N rows x 4 parties on loopback real nodes (issue 24 item 4): reported, not asserted.

The data: ``benchmarks/gen_10m.py`` (synthetic sparse binary rows in a9a's LIBSVM layout, read
by every node's bundled-dataset loader from its node config's ``data-dir``; ``dataset=a9a``).
The deployment: ``flower_vfl.deploy.local.deploy_local`` (SuperLink + one SuperNode per party on
loopback, TLS, registered keys bound to parties, the warm executor; its own FLWR_HOME and free
ports), sampled while it runs by ``bench_soak.sampled_run`` / ``bench_soak.sample`` (every
process it started and their descendants, from /proc: RSS, its high-water mark VmHWM, PSS).

Before the first deployment each party's block cache is filled once, two parties at a time, each
in its own process (``io/party_cache.cached_party_block`` into the party's ``state-dir``: the parse a
party does once on its own machine), so the parties' first messages do not parse the file
four times at once; the ServerApp parses the labels itself (``io/data.labels``), as it does.

Reported per ``--wire`` (run config ``wire-dtype``): array bytes per round per party, both
directions (``$FLOWER_VFL_TIMING``: the central node's exchange writes, per request, the
serialized array bytes sent to and received from each node), s/round (median of the
differences of report.json's ``elapsed_s``, rounds 2..R), the final objective and test
figures, and the peak RSS (VmHWM) of the SuperLink, the ServerApp (and Flower's SuperExec that
starts it), each SuperNode, each warm executor and the largest forked ClientApp of each party.
A shared machine is never run out of memory: when MemAvailable falls below ``--min-avail-gb``
the deployment is stopped and where it was is recorded (``memory_guard``).

    python benchmarks/gen_10m.py --rows 10000000 --out /tmp/vfl10m/10m
    python -W ignore benchmarks/bench_10m.py --data-dir /tmp/vfl10m/10m --rounds 4 \\
        --wire float64,float32 --out benchmarks/results/bench_10m.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_soak  # noqa: E402  (sample, sampled_run)

TIMING_ENV = "FLOWER_VFL_TIMING"

_FILL = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.time()
from flower_vfl.io.party_cache import cached_party_block
D, Dt = cached_party_block("a9a", {m}, {parties}, {data!r}, {state!r})
print(json.dumps({{"party": {m}, "seconds": time.time() - t0, "shape": list(D.shape), "nnz": int(D.nnz),
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def fill_caches(states: Path, data_dir: str, parties: int, jobs: int = 2) -> list[dict]:
    """Each party's block cache in ``states/party<m>`` (``jobs`` parties at a time, each in its
    own process); a cache already there is only checked (its key hashes the data file)."""
    out, running = [], []
    for m in range(parties):
        code = _FILL.format(root=str(ROOT), m=m, parties=parties, data=data_dir, state=str(states / f"party{m}"))
        running.append((m, subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
        if len(running) >= jobs or m == parties - 1:
            for k, proc in running:
                so, se = proc.communicate()
                if proc.returncode:
                    raise RuntimeError(f"filling party {k}'s block cache failed: {se[-2000:]}")
                out.append(json.loads(so.strip().splitlines()[-1]))
                print(f"  party {k} block cache: {out[-1]}", flush=True)
            running = []
    return out


def bytes_per_round(timing: Path, node_party: dict) -> dict:
    """From the exchange's timing lines: per message type, per party, array bytes down / up
    (median over the requests of that type that carried arrays, and each request's)."""
    per: dict = {}
    if not timing.is_file():
        return per
    for line in timing.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("who") != "server" or "array_bytes_out" not in rec:
            continue
        kind = ",".join(rec.get("type", []))
        for nid, b in rec["array_bytes_out"].items():
            per.setdefault(kind, {}).setdefault(node_party.get(nid, nid), {"down": [], "up": []})["down"].append(b)
        for nid, b in rec["array_bytes_in"].items():
            per.setdefault(kind, {}).setdefault(node_party.get(nid, nid), {"down": [], "up": []})["up"].append(b)
    # per request, in order; the median over the requests answered with arrays (an error reply,
    # e.g. Flower's "ClientApp stopped responding", carries none)
    return {k: {str(p): {d: (statistics.median([b for b in x[d] if b]) if any(x[d]) else 0) for d in x}
                | {f"{d}_each": x[d] for d in x} | {"requests": len(x["down"])}
                for p, x in sorted(v.items(), key=lambda t: str(t[0]))} for k, v in per.items()}


def peaks(samples) -> dict:
    """Largest VmHWM (MB) per process role over the samples; forked ClientApps per executor."""
    out: dict = {}
    for s in samples:
        for role, v in s["procs"].items():
            out[role] = max(out.get(role, 0.0), v.get("hwm_mb", v["rss_mb"]))
        for ex, h in s["forked"].get("hwm_mb_by_exec", {}).items():
            key = f"clientapp({ex})"
            out[key] = max(out.get(key, 0.0), h)
    return {k: round(v, 1) for k, v in sorted(out.items())}


def node_parties(logs: Path) -> dict:
    """node id -> party, from the ServerApp's 'parties: 0 -> node 123, ...' log line."""
    import re
    for f in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"parties: ((?:\d+ -> node \d+(?:, )?)+)", text)
        if m:
            return {nid: int(p) for p, nid in re.findall(r"(\d+) -> node (\d+)", m.group(1))}
    return {}


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def one(data_dir: str, parties: int, rounds: int, wire: str, every: float, keep: bool, min_avail_gb: float,
        states: Path) -> dict:
    from flower_vfl.deploy.local import Processes
    work = Path(tempfile.mkdtemp(prefix=f"bench_10m_{wire}_", dir=os.environ.get("BENCH_10M_TMP")))
    os.environ["FLOWER_VFL_CACHE"] = str(Path(data_dir) / "cache")     # the bundled loader's ID sidecars
    timing = work / "timing.jsonl"
    from timing.flower_vfl_timing import enable   # benchmarks/timing/: the nodes' and forked tasks' lines
    enable(timing)                                 # ($FLOWER_VFL_TIMING, and its sitecustomize on PYTHONPATH)
    t0 = time.time()
    fills = fill_caches(states, data_dir, parties)
    fill_s = time.time() - t0
    procs = Processes(work / "logs")
    out = work / "out"
    nodes = {m: {"state-dir": str(states / f"party{m}"), "data-dir": data_dir} for m in range(parties)}
    rc = {"dataset": "a9a", "num-parties": parties, "max-rounds": rounds, "tol": 0.0, "data-dir": data_dir,
          "out-dir": str(out), "wire-dtype": wire, "round-timeout": 3600.0}
    res: dict = {}
    job = bench_soak.deploy_job(work, parties, rc, nodes, procs, res)
    loads, guard = [], {}

    def sample():
        loads.append(os.getloadavg()[0])
        s = bench_soak.sample(procs)
        s["mem_available_gb"] = mem_available_gb()
        if s["mem_available_gb"] < min_avail_gb and not guard:   # a shared machine: never run it out
            guard.update(t=time.time(), avail_gb=s["mem_available_gb"], total_rss_mb=s["total_rss_mb"],
                         hwm=peaks([s]), round=len(bench_soak.rounds_done(out)))
            print(f"  memory guard: {s['mem_available_gb']:.1f} GB available < {min_avail_gb} GB: stopping the "
                  f"deployment ({guard})", flush=True)
            procs.stop_all()
        return s
    samples, el, diffs, t_start = bench_soak.sampled_run(job, sample, procs, out, every)
    report = {}
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        pass
    hist = report.get("rounds", [])
    final = {k: v for k, v in (report.get("final") or {}).items() if isinstance(v, (int, float))}
    row = {"wire": wire, "parties": parties, "rows": None, "rounds": len(el), "exit_code": res.get("exit_code"),
           "error": res.get("error"), "fill_caches_s": round(fill_s, 1), "fills": fills,
           "wall_s": round(time.time() - t_start, 1), "s_per_round": statistics.median(diffs) if diffs else None,
           "round_gaps_s": diffs, "round1_end_s": el[0] if el else None, "elapsed_s": el,
           "objective": [h.get("objective") for h in hist], "train_loss": [h.get("train_loss") for h in hist],
           "final": final, "peak_hwm_mb": peaks(samples),
           "peak_total_rss_mb": max((s["total_rss_mb"] for s in samples), default=None),
           "peak_total_pss_mb": max((s["total_pss_mb"] for s in samples), default=None),
           "bytes": bytes_per_round(timing, node_parties(work / "logs")),
           "memory_guard": guard or None,
           "min_mem_available_gb": min((s.get("mem_available_gb", 0) for s in samples), default=None),
           "load_mean": statistics.fmean(loads) if loads else None, "load_max": max(loads) if loads else None,
           "workdir": str(work)}
    try:
        row["rows"] = json.loads((Path(data_dir) / "meta.json").read_text())["rows"]
    except (OSError, ValueError, KeyError):
        pass
    if not keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True, help="a folder written by benchmarks/gen_10m.py")
    ap.add_argument("--parties", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--wire", default="float64,float32", help="wire dtypes to run, in order")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between /proc samples")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_10m.json"))
    ap.add_argument("--keep", action="store_true", help="keep each deployment's folder (logs)")
    ap.add_argument("--min-avail-gb", type=float, default=2.5,
                    help="stop a deployment when the machine's MemAvailable falls below this (a shared machine)")
    ap.add_argument("--states", default=None, help="the parties' state-dirs (block caches), reused across runs "
                                                    "(default: <data-dir>/states)")
    args = ap.parse_args(argv)
    data_dir = str(Path(args.data_dir).resolve())
    rows = []
    for wire in [w.strip() for w in args.wire.split(",") if w.strip()]:
        print(f"== wire-dtype={wire}", flush=True)
        r = one(data_dir, args.parties, args.rounds, wire, args.every, args.keep, args.min_avail_gb,
                Path(args.states or Path(data_dir) / "states"))
        rows.append(r)
        print(json.dumps({k: r[k] for k in ("wire", "rows", "rounds", "exit_code", "error", "s_per_round",
                                            "round1_end_s", "objective", "final", "peak_hwm_mb", "bytes",
                                            "load_mean")}), flush=True)
        Path(args.out).write_text(json.dumps({"rows": rows, "command": "python -W ignore benchmarks/bench_10m.py "
                                              + " ".join(argv or sys.argv[1:]),
                                              "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                                          "max_rss_self_mb": resource.getrusage(
                                                              resource.RUSAGE_SELF).ru_maxrss / 1024}}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
