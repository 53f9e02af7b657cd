"""Flower ServerApp: the central node (label owner) of vertical ADMM sharing."""

import copy
from logging import INFO, WARNING
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from flower_vfl import routes
from flower_vfl.config.settings import run_setting
from flower_vfl.errors import install_log_filter
from flower_vfl.config.schema import parse_run_config
from flower_vfl.io.checkpoint import DiskError, atomic_write, disk_writes, writable_folder
from flower_vfl.io.data import labels
from flower_vfl.privacy.label_dp import label_source
from flower_vfl.reporting.report import write_report
from flower_vfl.strategies import own_data
from flower_vfl.strategies.moment import MomentStrategy
from flower_vfl.strategies.stacked_ssp import StackedSSPStrategy
from flower_vfl.strategies.config import MomentConfig, StrategyConfig
from flower_vfl.reporting.notes import paper_inf_note
from flower_vfl.strategies.vertical_admm import VerticalADMMStrategy, log_round

app = ServerApp()
install_log_filter()     # our user-facing errors: one line, no traceback; the run still fails (flower_vfl.errors)


def make_strategy(run_config, y=None, y_test=None, ids=None) -> VerticalADMMStrategy:
    """The strategy for the bundled dataset, or for labels ``y`` already aligned (own data; ``ids``:
    the labels file's ID of each row of ``y``, for the label store)."""
    cfg = parse_run_config(run_config)        # every key checked before any data is read
    get = cfg.__getitem__
    check_route(cfg, own=y is not None or own_data.enabled(run_config))
    if y is None:
        y, y_test = labels(str(get("dataset")), get("data-dir") or None)
    if bool(get("dp")):                        # unknown party ids: an error, never a silent non-private run
        from flower_vfl.config.settings import dp_party_ids
        dp_party_ids(run_config, int(get("num-parties")))
    route = routes.get(str(get("route")))         # its own builder (a route folder), else this app's
    build = STRATEGIES[route.name] if route.build is None else route.load("build")
    return build(cfg, y, y_test, ids)


def make_admm_strategy(cfg: dict, y, y_test, ids=None) -> VerticalADMMStrategy:
    """The ADMM route's strategy (route='admm') from the checked run config ``cfg``."""
    get = cfg.__getitem__
    state = get("state-dir")
    # label DP: the labels are drawn once per source and ID and reused (privacy/label_dp.py), in
    # the label owner's state-dir when the run config names one, else its default_state_dir() (an
    # out-dir changes from run to run: a store there would draw afresh every run)
    source = (label_source(path=get("labels-path"), id_column=get("id-column"), label_column=get("label-column"),
                           ids=ids) if get("labels-path") else label_source(dataset=str(get("dataset"))))
    # every setting from the run config through the one parameter table (strategies/config.py)
    return VerticalADMMStrategy(y, y_test, StrategyConfig.from_run_config(cfg),
                                label_source=source, label_store=state or None)


#: run-config keys of the ADMM route that the stacked SSP route has no use for: a value other than
#: the default is refused with route='stacked-ssp' (a key must change the run or be refused)
ADMM_ONLY_KEYS = ("loss", "penalty", "lam", "rho", "alpha", "fit-intercept", "acceleration", "variant", "x-solver",
                  "max-rounds",
                  "tol", "eval-every", "label-epsilon", "stragglers", "max-staleness", "resume", "secagg")
#: the ADMM keys the moment route reads (its pool objective's L2 coefficient, its own ADMM rounds)
MOMENT_KEYS = ("lam", "rho", "max-rounds", "tol")
#: what each route does, for the refusal of a key it does not use
_ROUTE_DOES = {"stacked-ssp": "each private party makes one SSP release and the label owner stacks the scores",
               "moment": "each private party makes one moment release, then ADMM sharing on the pool: the run "
                         "config's lam, rho, max-rounds and tol apply, nothing else of the ADMM route"}


def check_route(cfg: dict, own: bool = False) -> None:
    """With route='stacked-ssp' or 'moment' (checked run config ``cfg``): refuse own data (``own``)
    and every ADMM-only key the route does not read set to anything but its default, naming the
    key. Nothing for route='admm'."""
    from flower_vfl.config.schema import SCHEMA, ConfigError
    route = cfg["route"]
    if route == "admm":
        return
    if own:
        raise ConfigError(f"run config route={route!r} runs on a bundled dataset only (PSI alignment of the "
                          "parties' own files is not built for this route): remove labels-path / score-ids-path / "
                          "mode, or use route='admm'")
    for key in ADMM_ONLY_KEYS:
        if route == "moment" and key in MOMENT_KEYS:
            continue
        if cfg[key] != SCHEMA[key].default:
            raise ConfigError(f"run config key {key!r}={cfg[key]!r} is refused with route={route!r}: it sets "
                              f"the ADMM route, which this run does not use ({_ROUTE_DOES[route]}). Remove it, or "
                              "use route='admm'")
    if route == "moment" and not cfg["lam"] > 0:
        raise ConfigError("run config key 'lam'=0.0 is refused with route='moment': the pool objective needs an L2 "
                          "coefficient > 0 (3e-4 is the choice at dp-epsilon=1; docs/privacy_parties.md)")


def make_moment_strategy(cfg: dict, y, y_test, ids=None) -> MomentStrategy:
    """The moment route's strategy (route='moment', docs/privacy_parties.md) from the checked run
    config ``cfg`` (:func:`check_route` passed): ``lam`` the pool objective's L2 coefficient,
    ``rho`` its ADMM penalty (0: 0.1 / pool rows), ``max-rounds`` the rounds per fit, ``tol`` the
    early stop (0: every round)."""
    return MomentStrategy(y, y_test, MomentConfig.from_run_config(cfg))


def make_stacked_strategy(cfg: dict, y, y_test, ids=None) -> StackedSSPStrategy:
    """The stacked SSP route's strategy (route='stacked-ssp', docs/privacy_parties.md) from the
    checked run config ``cfg`` (:func:`check_route` passed)."""
    return StackedSSPStrategy(y, y_test, num_parties=int(cfg["num-parties"]), timeout=float(cfg["round-timeout"]),
                              party_wait=float(cfg["party-wait"]), party_keys=cfg["party-keys"] or None,
                              max_release=float(cfg["max-release"]))


#: route -> its central node's builder from the checked run config, for every route this ServerApp
#: serves without a builder of its own (flower_vfl.routes: the routes of the "vertical" app, picked
#: by the run config's route)
STRATEGIES = {"admm": make_admm_strategy, "stacked-ssp": make_stacked_strategy, "moment": make_moment_strategy}
if sorted(STRATEGIES) != sorted(r.name for r in routes.for_app("vertical") if r.build is None):
    raise RuntimeError(f"apps/server.py builds the routes {sorted(STRATEGIES)} but flower_vfl.routes registers "
                       f"{sorted(r.name for r in routes.for_app('vertical') if r.build is None)} for the vertical "
                       "app without a builder of their own")


def writable_folders(run_config) -> None:
    """Before any message: ``out-dir`` and the label owner's ``state-dir`` (its checkpoint folder,
    by default ``<out-dir>/state``) are writable folders (a plain file there or above it, a
    read-only folder, a full disk: a :class:`DiskError` naming the key, the path and the fix)."""
    out, state = str(run_setting("out-dir", run_config)), str(run_setting("state-dir", run_config))
    if out:
        writable_folder(out, "out-dir")
    if state or out:
        writable_folder(state or Path(out) / "state", "state-dir")


def write_outputs(strategy: VerticalADMMStrategy, run_config, final: dict | None = None) -> None:
    """report.json and metrics.csv in out-dir (rewritten every round, and when a run fails, so
    a failed run leaves what it did), decision_test.npy once there is one. Each file is replaced
    atomically: a disk that fills keeps the previous one and fails with a :class:`DiskError`."""
    out = str(run_setting("out-dir", run_config))
    if not out:
        return
    write_report(out, dict(run_config), strategy.history_, strategy.final_ if final is None else final,
                 extra={"engine": "flower", "privacy": strategy.privacy_,
                        "party_models": {str(m): v for m, v in sorted(getattr(strategy, "party_models_", {}).items())},
                        "label_privacy": strategy.label_privacy_.report()
                        if getattr(strategy, "label_privacy_", None) else "labels not protected: label-epsilon=0 (every party sees sign(y) = -label)"},
                 key="out-dir")
    if hasattr(strategy, "decision_test_"):
        path = Path(out) / "decision_test.npy"
        with disk_writes(path, "out-dir", "test decisions"):
            atomic_write(path, lambda fh: np.save(fh, strategy.decision_test_))


def outputs_snapshot(strategy):
    """What :func:`write_outputs` reads of ``strategy``, copied: the next round changes the
    strategy while its writer thread writes this round's files."""
    snap = SimpleNamespace(history_=[dict(row) for row in strategy.history_],
                           final_=copy.deepcopy(strategy.final_), privacy_=copy.deepcopy(strategy.privacy_),
                           party_models_=dict(getattr(strategy, "party_models_", {})))
    lp = getattr(strategy, "label_privacy_", None)
    if lp is not None:
        report = lp.report()
        snap.label_privacy_ = SimpleNamespace(report=lambda: report)
    if hasattr(strategy, "decision_test_"):
        snap.decision_test_ = np.array(strategy.decision_test_, copy=True)
    return snap


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
        if paper_inf_note(rep["totals"]):     # paper=inf printed unexplained otherwise
            log(INFO, "party %s privacy: %s", party, paper_inf_note(rep["totals"]))
    lp = getattr(strategy, "label_privacy_", None)
    if lp is not None:     # epsilon answered by dp-accounting for the randomized response run
        log(INFO, "label owner privacy: randomized response on the training labels, label-DP eps=%.4g "
            "(delta=0); every dual y the parties received is post-processing of it", lp.spent())
    if strategy.stopped_reason_:
        log(WARNING, "stopped early: %s", strategy.stopped_reason_)


@app.main()
def main(grid: Grid, context: Context) -> None:
    check_route(parse_run_config(context.run_config),     # every key checked before anything is read or sent
                own=own_data.enabled(context.run_config))
    predict = own_data.enabled(context.run_config) and str(context.run_config.get("mode", "train")) == "predict"
    if not predict:                            # (predict reads its model from out-dir: it may be read-only)
        writable_folders(context.run_config)   # the run's files have somewhere to go, before any round
    if own_data.enabled(context.run_config):   # the label owner's own files, PSI-aligned (docs/own-data.md)
        if predict:
            own_data.predict(grid, context.run_config)
            return
        warm = warm_plots_thread(context.run_config)      # its run.png, as the bundled route's
        try:
            strategy = own_data.train(grid, context.run_config, make_strategy, progress=log_round)
        finally:
            _join(warm)
    else:
        cfg = parse_run_config(context.run_config)
        strategy = make_strategy(context.run_config)
        warm = warm_plots_thread(context.run_config)

        def progress(k, row):
            if isinstance(strategy, StackedSSPStrategy):      # one exchange, no ADMM residuals
                log(INFO, "stacked SSP route: %d parties released once, test_loss=%.4f, test_accuracy=%.4f",
                    row["parties"], row.get("test_loss", float("nan")), row.get("test_accuracy", float("nan")))
            elif isinstance(strategy, MomentStrategy):        # pool rounds: no training loss to show
                log(INFO, "moment route: fit %d round %d, primal_residual=%.3g, dual_residual=%.3g, change=%.3g",
                    row["fit"], row["fit_round"], row["primal_residual"], row["dual_residual"], row["max_change"])
            elif isinstance(strategy, VerticalADMMStrategy):
                log_round(k, row)
            else:                                             # a route folder's central node
                log(INFO, "route %s: round %d: %s", cfg["route"], k, row)
            writer = getattr(strategy, "writer", None)
            if writer is None:
                write_outputs(strategy, context.run_config, {"rounds": k, "running": True})
            else:       # after this round's checkpoint, while the parties compute the next round
                snap, rc = outputs_snapshot(strategy), context.run_config
                writer.submit(lambda: write_outputs(snap, rc, {"rounds": k, "running": True}))

        strategy.progress = progress
        try:
            strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=int(cfg["max-rounds"]),
                           timeout=float(cfg["round-timeout"]))
        except Exception as exc:      # keep what was done, then fail the run (non-zero status)
            try:
                _join(warm)
                write_outputs(strategy, context.run_config,
                              dict(strategy.final_ or {"rounds": len(strategy.history_)}, failed=True,
                                   error=f"{type(exc).__name__}: {exc}"))
            except DiskError as disk:  # the disk that failed the run: the run's own error is the one to see
                log(WARNING, "%s", disk)
            raise
        _join(warm)
    log_final(strategy)
    write_outputs(strategy, context.run_config)


def warm_plots_thread(run_config):
    """A daemon thread drawing a throwaway run (:func:`flower_vfl.reporting.warm.warm_plots`) while
    the rounds run, when the run writes its outputs (out-dir): its last write then does not pay
    matplotlib's import and first figure. Join it (:func:`_join`) before any write that plots."""
    if not run_setting("out-dir", run_config):
        return None
    import threading

    from flower_vfl.reporting.warm import warm_plots
    t = threading.Thread(target=warm_plots, name="flower-vfl-warm-plots", daemon=True)
    t.start()
    return t


def _join(thread) -> None:
    if thread is not None:
        thread.join()
