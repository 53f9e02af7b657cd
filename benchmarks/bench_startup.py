"""Where the README's main job (``flower-vfl simulate``: breast cancer, 2 parties, 50 rounds) spends its
time before round 1, side by side with Flower's own empty app (``benchmarks/flower_noop``: one
round trip of a scalar to each of the 2 SuperNodes) started the same way (issue 24 item 5,
issue 40 item 3).

The job is run here step by step as ``flower_vfl.cli.commands.cmd_simulate`` runs it (same calls,
same app folder, same run config), each step timed on the wall clock:

- ``cli import``: a fresh interpreter importing what the ``flower-vfl`` entry point imports
  (``flower_vfl.cli.commands``), measured in a subprocess (``python -c``);
- ``superlink``: ``flower_vfl.deploy.local.simulation_superlink`` (start ``flower-superlink
  --simulation`` on a free port, wait for its ``/health``);
- ``flwr run``: ``local.submit`` (the ``flwr`` CLI process: build the FAB, upload, get a run id; as in
  ``cmd_simulate``, a process that imported Flower's CLI while the SuperLink started, ``WarmFlwr``);
- ``to first log line`` / ``to round 1`` / ``rounds`` / ``to finished``: from the submit's return,
  stamped on the lines of ``flwr log --stream`` (``local.wait_run``; Flower streams the log every
  0.5 s): the first line of the run's log, the ServerApp's line after round 1 (``round 1:
  train_loss=...``; the empty app: its one line of timings, printed right after its one round
  trip), its last round's line, and the run's status read as finished (``flwr ls`` polled every
  ``--poll`` s, as the CLI does).

The main job gets the Ray settings ``flower-vfl simulate`` gives it (flower_vfl.cli.job.RAY_LOADED_MACHINE);
the empty app runs with Flower's defaults. ``--apps main,noop`` (default) runs the two jobs alternately, ``--repeats`` times each, so a
change of the machine's load hits both alike; the summary gives the ratio of the medians of
``before_round_1_s`` (main / empty app) and ``uptime``'s load before each job.

    python -W ignore benchmarks/bench_startup.py --repeats 3 --timeline

Figures vary with the machine's load: report ratios/splits from one run, min and median.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the ServerApp's line after a round (flower_vfl.apps.server.log_round), as RoundProgress reads it;
#: the empty app's only line, its timings' JSON (benchmarks/flower_noop/noop_app/server_app.py)
ROUND_1 = {"main": re.compile(r"\bround 1: train_loss="), "noop": re.compile(r'\{"tiny": ')}
ROUND_N = {"main": re.compile(r"\bround \d+: train_loss=|\bfinal \(round \d+\)"), "noop": ROUND_1["noop"]}
NOOP_APP = Path(__file__).resolve().parent / "flower_noop"


def cli_import_s() -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-W", "ignore", "-c", "import flower_vfl.cli.commands"], check=True)
    return time.monotonic() - t


def one_job(rounds: int, poll: float, timeline: list | None = None, app: str = "main") -> dict:
    """One job started as ``cmd_simulate`` starts it: the main job (``app='main'``) or the empty
    app (``'noop'``) on the same launcher, federation config and machine."""
    from flower_vfl.cli.app import app_dir
    from flower_vfl.cli.commands import simulation_federation
    from flower_vfl.deploy import local

    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    (workdir / "node-config.json").write_text("{}")
    stamps: dict[str, float] = {}
    t0 = time.monotonic()
    if app == "main":
        folder, rc = app_dir(), f"dataset='breast_cancer' num-parties=2 max-rounds={rounds}"
    else:
        folder, rc = NOOP_APP, "modes='tiny' repeats=1 warmup=0 num-nodes=2"
    env = {"FLOWER_VFL_NODE_CONFIG": str(workdir / "node-config.json")}
    if app == "main":                  # as cmd_simulate: Ray's settings for a loaded machine (the empty app: Flower's)
        import os

        from flower_vfl.cli.job import ray_env
        env.update(ray_env(os.environ))
    try:
        with local.simulation_superlink(workdir, env, command="bench-startup") as link:
            stamps["superlink"] = time.monotonic()
            run_id = local.submit(folder, link.connection, rc, link.env, federation_config=simulation_federation(2),
                                  warm=link.warm_flwr)         # as cmd_simulate: Flower's CLI imported meanwhile
            stamps["submitted"] = time.monotonic()

            def on_line(line):
                now = time.monotonic()
                if timeline is not None:
                    timeline.append((round(now - stamps["submitted"], 2), line.rstrip()[:160]))
                stamps.setdefault("first_line", now)
                if "round_1" not in stamps and ROUND_1[app].search(line):
                    stamps["round_1"] = now
                m = ROUND_N[app].search(line)
                if m:
                    stamps["last_round"] = now

            record = local.wait_run(run_id, link.connection, link.env, workdir / "run.log", poll=poll,
                                    echo=open("/dev/null", "w"), on_line=on_line)
            stamps["finished"] = time.monotonic()
        status = record.get("status")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    s = {k: v - t0 for k, v in stamps.items()}
    split = {
        "superlink_s": s["superlink"],
        "flwr_run_s": s["submitted"] - s["superlink"],
        "to_first_log_line_s": s.get("first_line", float("nan")) - s["submitted"],
        "to_round_1_s": s.get("round_1", float("nan")) - s["submitted"],
        "rounds_s": s.get("last_round", float("nan")) - s.get("round_1", float("nan")),
        "to_finished_s": s["finished"] - s.get("last_round", s["submitted"]),
        "total_s": s["finished"],
    }
    split["before_round_1_s"] = s.get("round_1", float("nan"))
    return {"app": app, "status": status, **{k: round(v, 3) for k, v in split.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=50, help="max-rounds (the README's main job: 50)")
    ap.add_argument("--poll", type=float, default=2.0, help="flwr ls status poll (the CLI's: 2 s)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_startup.json"))
    ap.add_argument("--timeline", action="store_true",
                    help="print every log line of the last job of each app with its arrival time after the submit")
    ap.add_argument("--apps", default="main,noop", help="comma-separated: main (flower-vfl simulate's job), noop "
                                                         "(Flower's empty app), run alternately")
    args = ap.parse_args(argv)
    import os
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    rows, timelines = [], {}
    for i in range(args.repeats):
        for app in apps:
            load0 = os.getloadavg()[0]
            timeline = [] if args.timeline else None
            # the main job's command imports flower_vfl's CLI first (`flower-vfl simulate`); the empty app's
            # launcher is the same code, so only its own import is counted as the main job's extra
            row = {"cli_import_s": round(cli_import_s(), 3) if app == "main" else 0.0,
                   **one_job(args.rounds, args.poll, timeline, app), "load": round(load0, 1)}
            row["before_round_1_s"] = round(row["before_round_1_s"] + row["cli_import_s"], 3)
            timelines[app] = timeline
            rows.append(row)
            print(json.dumps(row), flush=True)
    for app, timeline in timelines.items():
        if timeline:
            print(f"--- {app}: log lines, seconds after the submit")
        for t, line in timeline or []:
            print(f"{t:7.2f}  {line}")
    summary = {}
    for app in apps:
        mine = [r for r in rows if r["app"] == app]
        keys = [k for k in mine[0] if k.endswith("_s")]
        summary[app] = {k: {"min": min(r[k] for r in mine), "median": statistics.median(r[k] for r in mine)}
                        for k in keys}
        print(f"{app}: step                min      median (s)")
        for k in keys:
            print(f"  {k:22s} {summary[app][k]['min']:7.2f} {summary[app][k]['median']:9.2f}")
    if {"main", "noop"} <= set(apps):
        ratio = summary["main"]["before_round_1_s"]["median"] / summary["noop"]["before_round_1_s"]["median"]
        summary["ratio_before_round_1_median"] = round(ratio, 3)
        print(f"before round 1, main job / Flower's empty app (medians): {ratio:.2f}x; "
              f"load {min(r['load'] for r in rows)}-{max(r['load'] for r in rows)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
