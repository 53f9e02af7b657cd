"""The floor of a round on loopback real nodes, and where a round's CPU goes (issue 23 item 5).

One run of this script deploys, one job after the other on this machine, ``flower-vfl
deploy-local``'s loopback deployment (SuperLink with TLS and registered SuperNode keys, one
SuperNode per party) and measures for each job its seconds per round and the CPU seconds per
round of each class of process:

- ``noop-vfl``: Flower's empty app (``benchmarks/flower_noop``, mode ``payload-state``: one
  message to every SuperNode a round carrying what our central node sends, two float64
  N-vectors, N = 32,561, one N-vector back, two kept in ``context.state``; no compute) on
  deploy-local's own nodes (SuperNodes and warm executors forked from one warm process,
  ``flower-vfl-supernode --idle-poll 0.5``, each message's ClientApp forked from its executor);
- ``noop-stock``: the same app on Flower's ``flower-supernode`` as shipped (``--isolation
  subprocess``: its SuperExec starts a new ``flwr-clientapp`` interpreter per message);
- ``noop-idle``: the empty app on deploy-local's nodes, 2 round trips, then the ServerApp waits
  :data:`IDLE_S` s: the CPU the deployment spends while nothing happens (polling), per class;
- ``ours``: our a9a job (paper split into M parties, ``tol`` 0, no party private) on
  deploy-local's nodes, as ``bench_soak.py scale``.

``--jobs`` (default ``noop-vfl,noop-stock,ours``) x ``--parties`` (default 2,16), in the order
party count first, so that the 2- and 16-party figures of a kind are taken side by side.

Seconds per round: the median of the differences of ``report.json``'s ``elapsed_s`` over rounds
2..R (the noop app writes one too, a round = one round trip to every node). CPU: every ``--every``
s every process the deployment started and each descendant is read from /proc/<pid>/stat
(utime + stime; cutime + cstime = its children it reaped), grouped into classes:

- ``superlink``: the SuperLink process itself;
- ``central``: what the SuperLink starts (Flower's SuperExec and the ServerApp process);
- ``supernodes``: the SuperNode processes (and, with Flower's subprocess isolation, the
  ``flower-superexec`` each starts);
- ``executors``: the warm executors (deploy-local);
- ``clientapps``: the per-message ClientApp processes, as the CPU their parent reaped (the
  executor's / the node SuperExec's cutime + cstime);
- ``zygote``: the warm process the nodes are forked from;
- ``cli``: the ``flwr`` CLI this script's deployment runs (``flwr log --stream``, ``flwr ls``);
- ``bench``: this script's own process (the sampler reading /proc, deploy_local's thread);
- ``machine``: every CPU of the machine (/proc/stat, not idle), others' jobs included.

A class's CPU per round = its CPU seconds over the window [first sample after round 2, last
sample before round R] / the window's wall seconds x the median s/round. Writes
``benchmarks/results/floor.json`` (``--out``).

    python -W ignore benchmarks/bench_floor.py --parties 2,16 --rounds 6 --noop-rounds 12

``--before DIR`` (DIR/flower_vfl: another copy of the package, e.g. this tree with deploy/ from
an older commit): each deploy-local job runs first with that copy, then with this checkout, each
in its own interpreter (PYTHONPATH), so a before/after pair is measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOOP_APP = Path(__file__).resolve().parent / "flower_noop"
sys.path.insert(0, str(ROOT))
if os.environ.get("BENCH_FLOOR_SRC"):          # a job of --before: that copy of flower_vfl, here too
    sys.path.insert(0, os.environ["BENCH_FLOOR_SRC"])
TICK = os.sysconf("SC_CLK_TCK")
#: noop-idle: seconds the ServerApp waits after its 2 round trips; the idle rate is read over
#: [3 s after the last round, IDLE_S - 1 s after it]
IDLE_S = 25.0
CLASSES = ("superlink", "central", "supernodes", "executors", "clientapps", "zygote", "cli", "bench")


def _stat(pid: int):
    """(ppid, own CPU s, reaped children's CPU s, command) of one process, or None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        f = raw[raw.rindex(")") + 2:].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    # fields after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return (int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK,
            " ".join(c.decode(errors="replace") for c in cmd[:3]))


def machine_busy() -> float:
    """Non-idle CPU seconds of the whole machine since boot (/proc/stat)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


class CpuSampler:
    """Per-class cumulative CPU seconds of a deployment (see the module doc); each pid's last
    reading is kept after it is gone, so a class's total never goes back."""

    def __init__(self, procs):
        self.procs = procs
        self.last: dict[int, tuple[str, float]] = {}      # pid -> (class, cumulative s)
        self.me = os.getpid()

    def _roots(self):
        out = {}
        for name, p in self.procs.procs.items():
            kind = ("superlink" if name == "superlink" else "zygote" if name == "zygote" else
                    "executors" if name.startswith("exec") else "supernodes" if name.startswith("node") else None)
            if kind:
                out[p.pid] = kind
        return out

    def sample(self) -> dict:
        roots = self._roots()
        info = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                s = _stat(int(d))
                if s is not None:
                    info[int(d)] = s
        alive = {"clientapps": 0}
        for pid, (ppid, own, kids, cmd) in info.items():
            if pid in roots:
                kind = roots[pid]
                # reaped children: the executor's forked ClientApps; the zygote's and the node's
                # (Flower's subprocess isolation) are handled through their own entries
                if kind == "executors":
                    self.last[-pid] = ("clientapps", kids)
                self.last[pid] = (kind, own)
                continue
            # walk up to the nearest started process (or this script)
            chain, q = [], pid
            while q > 1 and q not in roots and q != self.me and len(chain) < 64:
                chain.append(q)
                q = info[q][0] if q in info else 0
            if q in roots:
                top = roots[q]
                if top == "superlink":
                    self.last[pid] = ("central", own)
                elif top in ("supernodes", "zygote"):
                    if "flower-superexec" in cmd:       # the node's SuperExec: its reaped children
                        self.last[pid] = ("supernodes", own)       # are the ClientApp interpreters
                        self.last[-pid] = ("clientapps", kids)
                    elif len(chain) >= 2 or "flwr-clientapp" in cmd:
                        alive["clientapps"] += 1        # counted when its parent reaps it
                    else:
                        self.last[pid] = ("supernodes", own)
                elif top == "executors":
                    alive["clientapps"] += 1            # a forked ClientApp, counted when reaped
            elif q == self.me and pid != self.me:
                self.last[pid] = ("cli", own + kids)
        tot = {c: 0.0 for c in CLASSES}
        for kind, v in self.last.values():
            tot[kind] += v
        ch = os.times()
        tot["cli"] += ch.children_user + ch.children_system    # the flwr calls this script reaped
        tot["bench"] = ch.user + ch.system                     # this script: the sampler, deploy_local
        return {"t": time.time(), "cpu": tot, "machine": machine_busy(), "alive": alive,
                "load1": os.getloadavg()[0]}


def run_job(kind: str, parties: int, rounds: int, data_dir: str, every: float, keep: bool) -> dict:
    from flower_vfl.deploy.local import Processes, deploy_local
    from bench_soak import sampled_run      # after flower_vfl: a --before job keeps its copy
    work = Path(tempfile.mkdtemp(prefix=f"bench_floor_{kind}_{parties}_"))
    procs = Processes(work / "logs")
    out = work / "out"
    nodes = {m: {"state-dir": str(work / f"party{m}-state"), "data-dir": data_dir} for m in range(parties)}
    if kind == "ours":
        rc = {"dataset": "a9a", "num-parties": parties, "max-rounds": rounds, "tol": 0.0, "data-dir": data_dir,
              "out-dir": str(out)}
        kw = {"app_dir": str(ROOT)}
    else:
        rc = {"modes": "payload-state", "repeats": rounds, "warmup": 1, "num-nodes": parties, "n": 32561,
              "busy-s": 0.0, "pull-first": 0.01, "pull-max": 0.1, "out-file": "", "out-dir": str(out)}
        kw = {"app_dir": str(NOOP_APP), "bind_keys": False}
        nodes = {m: {} for m in range(parties)}
        if kind == "noop-idle":             # 2 round trips, then the nodes idle for IDLE_S
            rc.update({"repeats": 2, "idle-s": IDLE_S})
    if kind == "noop-stock":
        kw.update(idle_poll=None, isolation="subprocess")
    res: dict = {}

    def job():
        try:
            res.update(deploy_local(work, parties, rc, node_configs=nodes, processes=procs, timeout=3600, **kw))
        except Exception as exc:         # reported below
            res["error"] = f"{type(exc).__name__}: {exc}"
    samples, el, diffs, t0 = sampled_run(job, CpuSampler(procs).sample, procs, out, every)
    spr = statistics.median(diffs) if diffs else None
    win = [s for s in samples if 2 <= s["round"] < len(el)]
    row = {"job": kind, "parties": parties, "rounds": len(el), "exit_code": res.get("exit_code"),
           "error": res.get("error"), "wall_s": time.time() - t0, "s_per_round": spr,
           "s_per_round_mean": statistics.fmean(diffs) if diffs else None, "elapsed_s": el}
    if len(win) >= 2 and spr:
        a, b = win[0], win[-1]
        dt = b["t"] - a["t"]
        per = {c: (b["cpu"][c] - a["cpu"][c]) / dt * spr for c in CLASSES}
        row.update({
            "window_s": dt, "window_rounds": [a["round"], b["round"]],
            "cpu_s_per_round": {c: round(v, 3) for c, v in per.items()},
            "cpu_s_per_round_deployment": round(sum(per.values()), 3),
            "machine_cpu_s_per_round": round((b["machine"] - a["machine"]) / dt * spr, 3),
            "machine_busy_cores": round((b["machine"] - a["machine"]) / dt, 3),
            "deployment_busy_cores": round(sum(b["cpu"][c] - a["cpu"][c] for c in CLASSES) / dt, 3),
            "load_mean": round(statistics.fmean(s["load1"] for s in win), 2),
            "clientapps_alive_max": max(s["alive"]["clientapps"] for s in win),
            "clientapps_alive_mean": round(statistics.fmean(s["alive"]["clientapps"] for s in win), 2)})
    idle = [s for s in samples if s["round"] == len(el) and len(el) >= 1]
    if kind == "noop-idle" and idle:
        t_end = idle[0]["t"]
        idle = [s for s in idle if t_end + 3.0 <= s["t"] <= t_end + IDLE_S - 1.0]
        if len(idle) >= 2:
            a, b = idle[0], idle[-1]
            dt = b["t"] - a["t"]
            row.update({"idle_window_s": dt,
                        "idle_cpu_cores": {c: round((b["cpu"][c] - a["cpu"][c]) / dt, 4) for c in CLASSES},
                        "idle_cpu_cores_deployment": round(sum(b["cpu"][c] - a["cpu"][c] for c in CLASSES) / dt, 4),
                        "idle_machine_busy_cores": round((b["machine"] - a["machine"]) / dt, 3)})
    if not keep and row["exit_code"] == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        row["workdir"] = str(work)
    return row


def _one_in_subprocess(kind, m, rounds, args, src) -> dict:
    """One job in a fresh interpreter running ``src``'s flower_vfl (deploy-local and every process
    it starts: PYTHONPATH), its row back as JSON."""
    import subprocess
    out = Path(tempfile.mkstemp(prefix="bench_floor_row_", suffix=".json")[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(src).resolve()), os.environ.get("PYTHONPATH", "")]),
               BENCH_FLOOR_SRC=str(Path(src).resolve()))
    cmd = [sys.executable, "-W", "ignore", __file__, "--one", f"{kind}:{m}:{rounds}", "--row-out", str(out),
           "--every", str(args.every), "--data-dir", args.data_dir] + (["--keep"] if args.keep else [])
    subprocess.run(cmd, env=env, check=False)
    try:
        return json.loads(out.read_text())
    except ValueError:
        return {"job": kind, "parties": m, "error": "the job's process wrote no row"}
    finally:
        out.unlink(missing_ok=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parties", default="2,16")
    ap.add_argument("--jobs", default="noop-vfl,noop-stock,ours")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of our job")
    ap.add_argument("--noop-rounds", type=int, default=12, help="round trips of the empty app (after 1 untimed)")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between CPU samples")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "floor.json"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--before", default=None,
                    help="a folder holding another copy of the flower_vfl package (a baseline): each job is run "
                         "with it first, then with this checkout, side by side (the deploy-local jobs; "
                         "noop-stock only once)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)      # kind:M:rounds, in a subprocess
    ap.add_argument("--row-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.data_dir = str(Path(args.data_dir).resolve())
    every = lambda m: args.every if m <= 4 else max(args.every, 1.0)       # noqa: E731
    if args.one:
        kind, m, rounds = args.one.split(":")
        row = run_job(kind, int(m), int(rounds), args.data_dir, every(int(m)), args.keep)
        import flower_vfl.deploy.local as used
        row["deploy_local_from"] = used.__file__
        Path(args.row_out).write_text(json.dumps(row))
        return
    rows = []
    out = Path(args.out)
    for m in [int(x) for x in args.parties.split(",")]:
        for kind in args.jobs.split(","):
            rounds = args.rounds if kind == "ours" else args.noop_rounds
            variants = [("before", args.before), ("after", str(ROOT))] if args.before and kind != "noop-stock" \
                else [("after" if args.before else "this", str(ROOT))]
            for variant, src in variants:
                r = _one_in_subprocess(kind, m, rounds, args, src)
                r["variant"] = variant
                rows.append(r)
                print(json.dumps({k: r.get(k) for k in ("job", "variant", "parties", "rounds", "exit_code", "error",
                                                        "s_per_round", "cpu_s_per_round", "cpu_s_per_round_deployment",
                                                        "idle_cpu_cores", "idle_cpu_cores_deployment",
                                                        "machine_busy_cores", "load_mean", "clientapps_alive_max")}),
                      flush=True)
                out.write_text(json.dumps(_result(rows, args, argv), indent=1))
    print(json.dumps(_result(rows, args, argv)["ratios"], indent=1))
    print(f"wrote {out}")


def _result(rows, args, argv) -> dict:
    ratios = {}
    for kind in args.jobs.split(","):
        for variant in sorted({r.get("variant") for r in rows if r["job"] == kind}):
            by = {r["parties"]: r for r in rows if r["job"] == kind and r.get("variant") == variant
                  and r.get("s_per_round")}
            ms = sorted(by)
            if len(ms) >= 2:
                lo, hi = by[ms[0]], by[ms[-1]]
                key = f"{kind} ({variant})"
                ratios[key] = {f"s_per_round {ms[-1]}/{ms[0]}": round(hi["s_per_round"] / lo["s_per_round"], 2)}
                if "cpu_s_per_round_deployment" in lo and "cpu_s_per_round_deployment" in hi:
                    ratios[key][f"cpu_per_round {ms[-1]}/{ms[0]}"] = round(
                        hi["cpu_s_per_round_deployment"] / lo["cpu_s_per_round_deployment"], 2)
    import flwr
    return {"benchmark": "round time and CPU per process class on loopback real nodes: empty app vs ours",
            "command": " ".join(["python -W ignore benchmarks/bench_floor.py", *(argv or sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "flwr": flwr.__version__},
            "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    main()
