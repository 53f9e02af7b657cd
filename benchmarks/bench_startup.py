"""Where the README's main job (``flower-vfl simulate``: breast cancer, 2 parties, 50 rounds) spends its
time before round 1 (issue 24 item 5).

The job is run here step by step as ``flower_vfl.cli.commands.cmd_simulate`` runs it (same calls,
same app folder, same run config), each step timed on the wall clock:

- ``cli import``: a fresh interpreter importing what the ``flower-vfl`` entry point imports
  (``flower_vfl.cli.commands``), measured in a subprocess (``python -c``);
- ``superlink``: ``flower_vfl.deploy.local.simulation_superlink`` (start ``flower-superlink
  --simulation`` on a free port, wait for its ``/health``);
- ``flwr run``: ``local.submit`` (the ``flwr`` CLI process: build the FAB, upload, get a run id; as in
  ``cmd_simulate``, a process that imported Flower's CLI while the SuperLink started, ``WarmFlwr``);
- ``to first log line`` / ``to round 1`` / ``rounds`` / ``to finished``: from the submit's return,
  stamped on the lines of ``flwr log --stream`` (``local.wait_run``): the first line of the run's
  log, the ServerApp's line after round 1 (``round 1: train_loss=...``), its last round's line, and
  the run's status read as finished (``flwr ls`` polled every ``--poll`` s, as the CLI does).

    python -W ignore benchmarks/bench_startup.py --repeats 2

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

#: the ServerApp's line after a round (flower_vfl.apps.server.log_round), as RoundProgress reads it
ROUND_1 = re.compile(r"\bround 1: train_loss=")
ROUND_N = re.compile(r"\bround \d+: train_loss=|\bfinal \(round \d+\)")


def cli_import_s() -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-W", "ignore", "-c", "import flower_vfl.cli.commands"], check=True)
    return time.monotonic() - t


def one_job(rounds: int, poll: float, timeline: list | None = None) -> dict:
    from flower_vfl.cli.app import app_dir
    from flower_vfl.cli.commands import simulation_federation
    from flower_vfl.deploy import local

    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    (workdir / "node-config.json").write_text("{}")
    stamps: dict[str, float] = {}
    t0 = time.monotonic()
    rc = f"dataset='breast_cancer' num-parties=2 max-rounds={rounds}"
    try:
        with local.simulation_superlink(workdir, {"FLOWER_VFL_NODE_CONFIG": str(workdir / "node-config.json")},
                                        command="bench-startup") as link:
            stamps["superlink"] = time.monotonic()
            run_id = local.submit(app_dir(), link.connection, rc, link.env, federation_config=simulation_federation(2),
                                  warm=link.warm_flwr)         # as cmd_simulate: Flower's CLI imported meanwhile
            stamps["submitted"] = time.monotonic()

            def on_line(line):
                now = time.monotonic()
                if timeline is not None:
                    timeline.append((round(now - stamps["submitted"], 2), line.rstrip()[:160]))
                stamps.setdefault("first_line", now)
                if "round_1" not in stamps and ROUND_1.search(line):
                    stamps["round_1"] = now
                m = ROUND_N.search(line)
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
    return {"status": status, **{k: round(v, 3) for k, v in split.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=50, help="max-rounds (the README's main job: 50)")
    ap.add_argument("--poll", type=float, default=2.0, help="flwr ls status poll (the CLI's: 2 s)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_startup.json"))
    ap.add_argument("--timeline", action="store_true",
                    help="print every log line of the last job with its arrival time after the submit")
    args = ap.parse_args(argv)
    import os
    rows = []
    for i in range(args.repeats):
        load0 = os.getloadavg()[0]
        timeline = [] if args.timeline else None
        row = {"cli_import_s": round(cli_import_s(), 3), **one_job(args.rounds, args.poll, timeline),
               "load": round(load0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for t, line in timeline or []:
        print(f"{t:7.2f}  {line}")
    keys = [k for k in rows[0] if k.endswith("_s")]
    summary = {k: {"min": min(r[k] for r in rows), "median": statistics.median(r[k] for r in rows)} for k in keys}
    print("step                    min      median (s)")
    for k in keys:
        print(f"{k:22s} {summary[k]['min']:7.2f} {summary[k]['median']:9.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
