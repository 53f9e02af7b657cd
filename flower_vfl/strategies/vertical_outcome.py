"""The vertical central node's run outcome: Flower's start() arguments it refuses, the warning when
DP made the model worse, and the plain statement of what the run protects (the report's
``protection``; the report and the Result are built by :class:`~flower_vfl.strategies.base.CentralBase`)."""

from __future__ import annotations

from logging import WARNING

from flwr.common.logger import log

from flower_vfl.privacy.outcome import FIX_NODE, dp_hurts_message

__all__ = ["check_start", "protection", "warn_if_dp_hurts"]


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


def warn_if_dp_hurts(state) -> None:
    """Set and log ``state.dp_warning`` when the private parties made the test loss worse than the
    non-private parties alone (the warm start's reference)."""
    ref = state.nonprivate_reference
    final = state.history[-1].get("test_loss") if state.history else None
    msg = dp_hurts_message(final, ref["test_loss_nonprivate"], measured="test loss", fix=FIX_NODE) if ref else None
    if msg:
        state.dp_warning = msg
        log(WARNING, "%s", state.dp_warning)
