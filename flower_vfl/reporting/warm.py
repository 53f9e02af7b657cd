"""Warm-up of the run's picture and page (``run.png``, ``report.html``) for a process that will
write them at its end: the ServerApp (issue 24, item 1). Above ``plots``, ``html`` and ``report``,
imported by nothing of theirs."""

from __future__ import annotations

from pathlib import Path

from flower_vfl.reporting.html import write_html
from flower_vfl.reporting.plots import plot_run
from flower_vfl.reporting.report import write_report

__all__ = ["warm_plots"]


def warm_plots() -> None:
    """Draw a throwaway two-round run into a temporary folder: matplotlib's import, its font cache and
    PNG writer are then loaded when the real run's ``run.png`` is drawn. The ServerApp calls it in a
    thread at the start of a run (while it mostly waits for the parties) and joins it before its
    last write, which was ~1.4 s longer without it at load 5 (issue 24, item 1). Never raises."""
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp(prefix="flower-vfl-warm-plots-")
    try:
        hist = [{"round": k, "train_loss": 1.0 / k, "objective": 1.0 / k, "primal_residual": 1.0 / k,
                 "dual_residual": 1.0 / k, "parties": 2, "elapsed_s": float(k)} for k in (1, 2)]
        write_report(tmp, {}, hist, {"rounds": 2, "test_loss": 0.5, "test_accuracy": 0.5, "wall_time_s": 2.0},
                     plot=False)
        plot_run(tmp)
        write_html([Path(tmp)])
    except Exception:  # noqa: BLE001  (a warm-up only: the real write reports its own errors)
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
