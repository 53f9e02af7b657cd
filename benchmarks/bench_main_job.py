"""The README's main job, run N times (under load), counting the runs Flower reports
``finished:completed`` (issue 22 item 2; goal: every one).

    python benchmarks/bench_main_job.py --runs 10 --load 2            # `flower-vfl simulate` (the README's job)
    python benchmarks/bench_main_job.py --runs 4 --load 2 --job flwr-run            # `flwr run . --stream`
    python benchmarks/bench_main_job.py --runs 4 --load 2 --job flwr-run --no-install

``--job simulate`` (default) runs ``flower-vfl simulate`` (2 parties, breast cancer, 50 rounds) as a
user would and reads the status it prints; ``--job flwr-run`` runs ``flwr run <checkout> --stream``
on Flower's own local SuperLink (its own FLWR_HOME and ports here, stopped at the end), with
Flower's runtime dependency installation on (Flower's default) or off (``--no-install``), then
asks ``flwr ls`` for the status. ``--load K`` starts K busy-loop processes for the whole
benchmark (each in its own session, stopped by its PID at the end). Prints one line per run and
a summary (counts by status, the load average), and writes them as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUS = re.compile(r"^run (\d+): (\S+)", re.M)


def start_load(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(k)]


def stop_load(procs) -> None:
    for p in procs:                      # only the processes started here, by their own group
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


def run_simulate(tmp: Path, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", "import sys; from flower_vfl.cli import main; sys.exit(main())",
                           "simulate"], cwd=tmp, capture_output=True, text=True, timeout=timeout)
    m = STATUS.findall(proc.stdout)
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith(("flower-vfl: error", "  error:"))]
    # a job whose Ray node did not start is started once more, saying so in one line (cmd_simulate)
    retried = sum("starting the job again" in ln for ln in proc.stderr.splitlines())
    folded = sum(ln.startswith("[traceback folded: ") for ln in proc.stdout.splitlines())
    return {"status": m[-1][1] if m else "no status", "exit": proc.returncode, "error": " | ".join(err)[:500],
            "retried": retried, "folded_tracebacks": folded,
            "stdout_lines": len(proc.stdout.splitlines()), "stderr_lines": len(proc.stderr.splitlines())}


def run_flwr(tmp: Path, timeout: float, install: bool) -> dict:
    from flower_vfl.deploy.local import Processes, free_port, managed_superlink_pids
    home = tmp / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
               FLWR_LOCAL_CONTROL_API_PORT=str(free_port()))
    if not install:
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    try:
        proc = subprocess.run(["flwr", "run", str(ROOT), "--stream"], env=env, capture_output=True, text=True,
                              timeout=timeout)
        ids = re.findall(r"started run (\d+)", proc.stdout)
        if not ids:
            return {"status": "not started", "exit": proc.returncode, "error": proc.stdout[-300:] + proc.stderr[-300:]}
        ls = subprocess.run(["flwr", "ls", "--run-id", ids[-1], "--format", "json"], env=env, capture_output=True,
                            text=True, timeout=120)
        rec = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"][0]
        return {"status": rec["status"], "exit": proc.returncode, "error": rec.get("status-details", "")}
    finally:     # Flower's local SuperLink stays detached: stop the one this FLWR_HOME started, by group
        procs = Processes(tmp / "logs")
        for pid in managed_superlink_pids(home):
            procs.adopt(pid)
        procs.stop_all()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes started for the benchmark")
    ap.add_argument("--job", choices=("simulate", "flwr-run"), default="simulate")
    ap.add_argument("--no-install", action="store_true", help="flwr-run: FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", default="", help="JSON file for the results")
    args = ap.parse_args(argv)
    load = start_load(args.load)
    results = []
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench-main-job-") as tmp:
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                try:
                    res = run_simulate(Path(tmp), args.timeout) if args.job == "simulate" else \
                        run_flwr(Path(tmp), args.timeout, install=not args.no_install)
                except subprocess.TimeoutExpired:
                    res = {"status": "timeout", "exit": None, "error": ""}
                res.update(run=i + 1, seconds=round(time.monotonic() - t0, 1), load_before=round(load0, 1),
                           loadavg=os.getloadavg()[0])
            results.append(res)
            print(f"run {i + 1}/{args.runs}: {res['status']} (exit {res['exit']}, {res['seconds']} s, "
                  f"load {res['load_before']:.1f} -> {res['loadavg']:.1f}"
                  f"{', retried once' if res.get('retried') else ''})"
                  f"{'  ' + res['error'] if res['error'] else ''}", flush=True)
    finally:
        stop_load(load)
    counts: dict = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    loads = [r["loadavg"] for r in results]
    secs = sorted(r["seconds"] for r in results)
    summary = {"job": args.job, "install": args.job == "flwr-run" and not args.no_install, "runs": len(results),
               "completed": counts.get("finished:completed", 0), "by_status": counts, "extra_load": args.load,
               "retried": sum(r.get("retried", 0) for r in results),
               "seconds_min_median_max": [secs[0], secs[len(secs) // 2], secs[-1]] if secs else [],
               "loadavg_min": min(loads, default=0.0), "loadavg_max": max(loads, default=0.0), "results": results}
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0 if summary["completed"] == summary["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
