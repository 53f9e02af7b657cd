"""Flower ServerApp: the central node (label owner) of vertical ADMM sharing."""

from flwr.app import Context
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


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = make_strategy(context.run_config).start(grid)
    out = str(run_setting("out-dir", context.run_config))
    if out:
        import numpy as np
        from pathlib import Path
        write_report(out, dict(context.run_config), strategy.history_, strategy.final_,
                     extra={"engine": "flower", "privacy": strategy.privacy_})
        if hasattr(strategy, "decision_test_"):
            np.save(Path(out) / "decision_test.npy", strategy.decision_test_)
