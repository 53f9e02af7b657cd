"""Run outputs shared by the in-process CLI and the Flower ServerApp."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write_report", "to_jsonable", "report_config", "paper_inf_note", "PAPER_INF_NOTE"]

from flower_vfl.reporting.notes import PAPER_INF_NOTE, paper_inf_note  # noqa: F401 (re-exported)


def report_config(config: dict) -> dict:
    """The settings a report records: the run config, except that an own-data run (its label
    owner's files named by ``labels-path`` or ``score-ids-path``, or a ``data`` entry) does not
    show the bundled ``dataset`` and ``data-dir`` it did not read (Flower fills them with their
    defaults); it gets ``data`` naming its files instead."""
    config = dict(config)
    own = config.get("labels-path") or config.get("score-ids-path")
    if own or config.get("data"):
        config.pop("dataset", None)
        config.pop("data-dir", None)
        if "data" not in config:
            config["data"] = (f"own files: the label owner's {own}; each party's file is named by its own node "
                              "config (not recorded here)")
    return config


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
                 plot: bool = True, key: str | None = None, written: list | None = None):
    """Write ``report.json`` (config, per-round metrics, final metrics, timing, extras),
    ``metrics.csv`` (one row per round) and, with ``plot``, ``run.png``
    (:func:`flower_vfl.reporting.plots.plot_run`) and ``report.html``
    (:func:`flower_vfl.reporting.html.write_html`); not while ``final`` says the run is still running.
    Each file is replaced atomically (temporary file, fsync, rename): a full or read-only disk
    leaves the previous one whole. With ``key`` (the run-config key that chose ``out_dir``) such
    a failure is a :class:`flower_vfl.io.checkpoint.DiskError` naming the path and the key.
    The config is recorded as :func:`report_config` gives it. Returns the report path; with
    ``written`` (a list), every file written is appended to it, in order."""
    from flower_vfl.io.checkpoint import atomic_write, disk_writes
    out = Path(out_dir)
    report = {"config": report_config(config), "rounds": history, "final": final}
    done = written if written is not None else []
    if extra:
        report.update(extra)
    path = out / "report.json"
    text = json.dumps(to_jsonable(report), indent=2).encode()
    keys = sorted({k for row in history for k in row}, key=lambda k: (k != "round", k))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    for row in history:
        w.writerow({k: to_jsonable(row.get(k, "")) for k in keys})
    guard = (lambda p, what: disk_writes(p, key, what)) if key else (lambda p, what: contextlib.nullcontext())
    with guard(out, "output folder"):
        out.mkdir(parents=True, exist_ok=True)
    with guard(path, "report"):
        atomic_write(path, lambda fh: fh.write(text))        # never leave a half-written report
    done.append(path)
    with guard(out / "metrics.csv", "metrics"):
        atomic_write(out / "metrics.csv", lambda fh: fh.write(buf.getvalue().encode()))
    done.append(out / "metrics.csv")
    if history and plot and not (final or {}).get("running"):   # a live run rewrites per round: no PNG
        try:                     # the run's picture (flower_vfl/reporting/plots.py) must not cost its report
            from flower_vfl.reporting.plots import plot_run
            done.append(Path(plot_run(out)))
        except Exception as exc:  # noqa: BLE001
            import warnings
            warnings.warn(f"run.png not written ({type(exc).__name__}: {exc}); report.json and "
                          "metrics.csv are complete", RuntimeWarning, stacklevel=2)
        try:                     # the run's page (flower_vfl/reporting/html.py): curves, ledgers, settings
            from flower_vfl.reporting.html import write_html
            done.append(Path(write_html([out])))
        except Exception as exc:  # noqa: BLE001
            import warnings
            warnings.warn(f"report.html not written ({type(exc).__name__}: {exc}); report.json and "
                          "metrics.csv are complete", RuntimeWarning, stacklevel=2)
    return path
