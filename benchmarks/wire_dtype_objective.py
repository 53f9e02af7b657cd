"""float32 against float64 on the wire (run config ``wire-dtype``): the objective after R rounds.

In process, through the real strategy, exchange and party handlers (``LocalGrid``, as
``tests/test_wire_dtype.py``): breast_cancer (3 parties) and a9a (2 parties, the paper split),
with and without acceleration, ``tol`` 0. Prints, per case, both objectives and their relative
difference, and writes them to ``--out``.

    python -W ignore benchmarks/wire_dtype_objective.py --out benchmarks/results/wire_dtype_objective.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", default="10,30,100,300")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "wire_dtype_objective.json"))
    args = ap.parse_args(argv)
    from flwr.common.logger import FLOWER_LOGGER
    FLOWER_LOGGER.setLevel(logging.WARNING)
    from test_wire_dtype import run
    rows = []
    for dataset, parties in (("breast_cancer", 3), ("a9a", 2)):
        for acc in ("auto", "none"):
            for rounds in [int(r) for r in args.rounds.split(",")]:
                kw = {"rounds": rounds, "parties": parties, "dataset": dataset, "acceleration": acc}
                f64 = run("float64", **kw)[0].history_[-1]["objective"]
                f32 = run("float32", **kw)[0].history_[-1]["objective"]
                rows.append({"dataset": dataset, "parties": parties, "acceleration": acc, "rounds": rounds,
                             "objective_float64": f64, "objective_float32": f32,
                             "relative_difference": abs(f32 - f64) / abs(f64)})
                print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "command": "python -W ignore benchmarks/wire_dtype_objective.py "
                                          + " ".join(argv or sys.argv[1:])}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
