"""The vertical central node's run outcome: Flower's start() arguments it refuses, the Result
it returns, the report's ``final`` and the plain statement of what the run protects."""

from __future__ import annotations

import time
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Result

from flower_vfl.privacy.outcome import FIX_NODE, dp_hurts_message

__all__ = ["check_start", "flower_result", "protection", "warn_if_dp_hurts", "finish"]


def check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn) -> None:
    """Flower's start() arguments that vertical training cannot honour: refused, naming the fix."""
    if initial_arrays is not None and len(initial_arrays):
        raise ValueError(f"initial_arrays holds {sorted(initial_arrays.keys())}; vertical ADMM has no global "
                         "model to send (each party starts x_m = 0 on its own node): pass ArrayRecord(), "
                         "and resume=<state folder> to continue a run")
    if num_rounds is not None and (isinstance(num_rounds, bool) or not isinstance(num_rounds, int)
                                   or num_rounds < 1):
        raise ValueError(f"num_rounds={num_rounds!r}; expected an integer >= 1")
    for name, cfg in (("train_config", train_config), ("evaluate_config", evaluate_config)):
        if cfg is not None and len(cfg):
            raise ValueError(f"{name} holds {sorted(cfg.keys())}; the parties take no settings from the "
                             "central node besides the protocol's round, rho, alpha and theta (a party's "
                             "settings are its node config's): pass None")
    if evaluate_fn is not None:
        raise ValueError("evaluate_fn: the central node holds no model to evaluate (each x_m stays on its "
                         "party); test metrics come from the parties' scores: give the strategy y_test "
                         "(and eval_every) and pass evaluate_fn=None")


def flower_result(st) -> Result:
    """Flower's Result of the run (see :meth:`VerticalADMMStrategy.start`)."""
    num = lambda v: int(v) if isinstance(v, (int, np.integer)) else float(v)  # noqa: E731
    res = Result(arrays=ArrayRecord({"intercept": Array(np.atleast_1d(np.asarray(st.central.b, float)))}))
    for row in st.history_:
        k = int(row["round"])
        vals = {key: v for key, v in row.items() if isinstance(v, (int, float, np.number)) and not
                isinstance(v, bool)}
        res.train_metrics_clientapp[k] = MetricRecord({key: num(v) for key, v in vals.items()
                                                       if not key.startswith("test_")})
        test = {key: num(v) for key, v in vals.items() if key.startswith("test_")}
        if test:
            res.evaluate_metrics_clientapp[k] = MetricRecord(test)
    return res


def protection(st) -> dict:
    """What the run protects, per party (the run report's plain statement)."""
    label_eps = getattr(st, "label_epsilon", None)
    labels = (f"label DP: randomized response at epsilon_label={label_eps:g}, before training"
              if label_eps else "not protected: sign(y) reveals every training label to every party")
    out = {}
    for m in range(st.num_parties):
        rep = st.privacy_.get(m) or st.privacy_.get(str(m))
        feats = (f"row-level DP of this party's training rows (budget epsilon={rep['config']['epsilon']:g}, "
                 f"delta={rep['config']['delta']:g}; spent {rep['totals'].get('exact', float('nan')):.4g} "
                 "by its own ledger)" if rep else
                 "not protected: exact D_m x_m released every round")
        out[str(m)] = {"features": feats, "labels": labels,
                       "scored_rows": "not protected: the scores of test/prediction rows are released"}
    return out


def warn_if_dp_hurts(st) -> None:
    """Set and log ``st.dp_warning_`` when the private parties made the test loss worse than the
    non-private parties alone (the warm start's reference)."""
    ref = getattr(st, "nonprivate_reference_", None)
    final = st.history_[-1].get("test_loss") if st.history_ else None
    msg = dp_hurts_message(final, ref["test_loss_nonprivate"], measured="test loss", fix=FIX_NODE) if ref else None
    if msg:
        st.dp_warning_ = msg
        log(WARNING, "%s", st.dp_warning_)


def finish(st, t0) -> None:
    """``st.final_``: the last history row, rounds, wall time, intercept, protection, and why
    the run stopped (``failed`` when it ended without a model)."""
    st.final_ = dict(st.history_[-1]) if st.history_ else {}
    st.final_["rounds"] = len(st.history_)
    st.final_["wall_time_s"] = time.perf_counter() - t0
    st.final_["intercept"] = np.asarray(st.central.b).tolist()
    if getattr(st, "dp_warning_", None):
        st.final_["dp_warning"] = st.dp_warning_
    st.final_["protection"] = protection(st)
    if st.stopped_reason_:
        st.final_["stopped_reason"] = st.stopped_reason_
    if st.failed_:
        st.final_["failed"] = True
