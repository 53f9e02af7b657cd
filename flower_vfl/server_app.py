"""Flower ServerApp: the central node (label owner) of vertical ADMM sharing."""

from logging import INFO, WARNING

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .config import run_setting
from .data import labels
from .report import write_report
from .strategies.vertical_admm import VerticalADMMStrategy

app = ServerApp()


def make_strategy(run_config) -> VerticalADMMStrategy:
    get = lambda k: run_setting(k, run_config)  # noqa: E731
    y, y_test = labels(str(get("dataset")), get("data-dir") or None)
    rho = float(get("rho"))
    return VerticalADMMStrategy(y, y_test, num_parties=int(get("num-parties")), loss=str(get("loss")),
                                rho=rho if rho > 0 else "auto", alpha=float(get("alpha")),
                                fit_intercept=bool(get("fit-intercept")), max_rounds=int(get("max-rounds")),
                                tol=float(get("tol")), eval_every=int(get("eval-every")))


def log_round(k: int, row: dict) -> None:
    """One line per round in the ServerApp's log (what `flwr run --stream` shows)."""
    extra = "".join(f", {key}={row[key]:.4f}" for key in ("test_loss", "test_accuracy") if key in row)
    log(INFO, "round %d: train_loss=%.6f, primal_residual=%.3g, dual_residual=%.3g, parties=%d%s",
        k, row["train_loss"], row["primal_residual"], row["dual_residual"], row.get("parties", 0), extra)


def log_final(strategy: VerticalADMMStrategy) -> None:
    f = strategy.final_
    if "test_loss" in f:
        log(INFO, "final (round %d): test_loss=%.4f, test_accuracy=%.4f, %.1f s",
            f["rounds"], f["test_loss"], f.get("test_accuracy", float("nan")),
            f["wall_time_s"])
    for party, rep in sorted(strategy.privacy_.items()):
        c = rep["config"]
        # the party's own ledger, accounted by the party (never a constant of this code)
        log(INFO, "party %s privacy: budget (eps=%g, delta=%g), spent %s, %d releases",
            party, c["epsilon"], c["delta"],
            ", ".join(f"{m}={v:.4g}" if isinstance(v, float) else f"{m}={v}" for m, v in rep["totals"].items()),
            len(rep["ledger"]["entries"]))
    if strategy.stopped_reason_:
        log(WARNING, "stopped early: %s", strategy.stopped_reason_)


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = make_strategy(context.run_config).start(grid, progress=log_round)
    log_final(strategy)
    out = str(run_setting("out-dir", context.run_config))
    if out:
        import numpy as np
        from pathlib import Path
        write_report(out, dict(context.run_config), strategy.history_, strategy.final_,
                     extra={"engine": "flower", "privacy": strategy.privacy_})
        if hasattr(strategy, "decision_test_"):
            np.save(Path(out) / "decision_test.npy", strategy.decision_test_)
