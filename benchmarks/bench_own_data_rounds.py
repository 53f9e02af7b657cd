"""Own-data rounds against bundled-data rounds of the same size on real SuperNodes (loopback).

Both through ``flower-vfl deploy-local`` (SuperLink + one SuperNode per party, TLS, registered
keys, warm executor: the CLI's defaults), alternately in one run so that a busy stretch of a
shared machine hits both alike:

- ``bundled``: ``--dataset a9a --num-parties 3`` (each party parses a9a once into its block cache);
- ``own``: the same a9a rows as the docs/own-data.md recipe: three CSV files (the label owner's
  labels + features 1-40, parties' 41-80 and 81-123, rows shuffled per file) and a9a.t split the
  same way as held-out files, so both runs have 3 SuperNodes, 32,561 training and 16,281 test
  rows and 123 columns; PSI-aligned, then the rounds;
- ``own-nocache`` (optional): ``own`` with ``FLOWER_VFL_BLOCK_CACHE=0`` (every message parses,
  aligns and preprocesses the party's files again, as before the own-data block cache).

Seconds per round = median of the differences of ``elapsed_s`` between consecutive rounds in the
run's report.json (start-up, PSI, identify and round 1 excluded). Same settings in all modes
(``--max-rounds R --tol 0 --lam 1e-4``).

    nice python -W ignore benchmarks/bench_own_data_rounds.py --rounds 8 --pairs 3 \\
        --modes bundled,own,own-nocache
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODES = ("bundled", "own", "own-nocache")
RANGES = [(0, 40), (40, 80), (80, 123)]


def write_files(folder: Path, data_dir: str) -> dict:
    """a9a and a9a.t as the label owner's and two parties' CSV files (all rows at every party)."""
    from flower_vfl.io.bundled import write_party_files
    from flower_vfl.io.data import load_all
    X, y, Xt, yt = load_all("a9a", data_dir)
    train = write_party_files(X, y, [f"u{i:06d}" for i in range(X.shape[0])], RANGES, folder, "csv", seed=3)
    test = write_party_files(Xt, yt, [f"t{i:06d}" for i in range(Xt.shape[0])], RANGES, folder, "csv", seed=4,
                             prefix="test")
    return {"train": [str(p) for p in train], "test": [str(p) for p in test], "n": int(X.shape[0]),
            "n_test": int(Xt.shape[0]), "d": int(X.shape[1])}


def command(mode: str, workdir: Path, files: dict, data_dir: str, rounds: int) -> list[str]:
    exe = Path(sys.executable).parent / "flower-vfl"
    cmd = [str(exe) if exe.is_file() else "flower-vfl", "deploy-local", "--workdir", str(workdir),
           "--max-rounds", str(rounds), "--tol", "0", "--lam", "1e-4"]
    if mode == "bundled":
        return cmd + ["--dataset", "a9a", "--data-dir", data_dir, "--num-parties", "3"]
    tr, te = files["train"], files["test"]
    return cmd + ["--labels", tr[0], "--party", tr[1], "--party", tr[2], "--labels-test", te[0],
                  "--party-test", te[1], "--party-test", te[2], "--model-dir", str(workdir / "models")]


def one(mode: str, files: dict, data_dir: str, rounds: int, base: Path, rep: int) -> dict:
    workdir = base / f"{mode}-{rep}"
    env = dict(os.environ)
    env.pop("FLOWER_VFL_BLOCK_CACHE", None)
    if mode == "own-nocache":
        env["FLOWER_VFL_BLOCK_CACHE"] = "0"
    t0 = time.monotonic()
    res = subprocess.run(command(mode, workdir, files, data_dir, rounds), env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    report = workdir / "out" / "report.json"
    out = {"mode": mode, "rep": rep, "exit": res.returncode, "wall_s": wall,
           "load_after": Path("/proc/loadavg").read_text().split()[0]}
    if report.is_file():
        rep_json = json.loads(report.read_text())
        rows = rep_json["rounds"]
        el = [r["elapsed_s"] for r in rows]
        out.update(rounds=len(rows), elapsed_s=el, s_per_round=float(statistics.median(np.diff(el))),
                   final={k: v for k, v in (rep_json.get("final") or {}).items() if isinstance(v, (int, float))})
    else:
        out["tail"] = (res.stdout[-1500:] + res.stderr[-1500:])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="interleaved repetitions of all modes")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--modes", default="bundled,own", help=f"comma-separated, of {MODES}")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_own_data_rounds.json"))
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {MODES}")
    data_dir = str(Path(args.data_dir).resolve())
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-own-rounds-") as tmp:
        base = Path(tmp)
        files = write_files(base / "files", data_dir)
        for rep in range(args.pairs):
            for mode in modes:
                r = one(mode, files, data_dir, args.rounds, base, rep)
                runs.append(r)
                print(f"rep {rep + 1} {mode:12s}: {r.get('s_per_round', float('nan')):.2f} s/round, "
                      f"{r.get('rounds')} rounds (exit {r['exit']}; deployment {r['wall_s']:.0f} s; "
                      f"load {r['load_after']})" + (f"\n{r['tail']}" if "tail" in r else ""), flush=True)
    per = {m: [r.get("s_per_round") for r in runs if r["mode"] == m] for m in modes}
    ratios = {m: [o / b if o and b else None for o, b in zip(per[m], per["bundled"])]
              for m in modes if m != "bundled" and "bundled" in per}
    for m, rs in ratios.items():
        print(f"{m}/bundled per repetition: {[None if v is None else round(v, 2) for v in rs]}")
    Path(args.out).write_text(json.dumps({
        "rounds": args.rounds, "modes": modes, "size": {k: files[k] for k in ("n", "n_test", "d")},
        "seconds_per_round": per, "ratio_over_bundled": ratios, "runs": runs,
        "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *sys.argv[1:]])}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
