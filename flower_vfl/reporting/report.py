"""Run outputs shared by the in-process CLI and the Flower ServerApp."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write_report", "to_jsonable"]


def to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def write_report(out_dir, config: dict, history: list[dict], final: dict, extra: dict | None = None,
                 plot: bool = True):
    """Write ``report.json`` (config, per-round metrics, final metrics, timing, extras),
    ``metrics.csv`` (one row per round) and, with ``plot``, ``run.png``
    (:func:`flower_vfl.reporting.plots.plot_run`; not while ``final`` says the run is still running).
    Returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": config, "rounds": history, "final": final}
    if extra:
        report.update(extra)
    path = out / "report.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_jsonable(report), indent=2))
    tmp.replace(path)            # never leave a half-written report
    keys = sorted({k for row in history for k in row}, key=lambda k: (k != "round", k))
    with open(out / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for row in history:
            w.writerow({k: to_jsonable(row.get(k, "")) for k in keys})
    if history and plot and not (final or {}).get("running"):   # a live run rewrites per round: no PNG
        try:                     # the run's picture (flower_vfl/reporting/plots.py) must not cost its report
            from flower_vfl.reporting.plots import plot_run
            plot_run(out)
        except Exception as exc:  # noqa: BLE001
            import warnings
            warnings.warn(f"run.png not written ({type(exc).__name__}: {exc}); report.json and "
                          "metrics.csv are complete", RuntimeWarning, stacklevel=2)
    return path
