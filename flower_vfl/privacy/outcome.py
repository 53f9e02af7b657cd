"""Did the private parties make the model worse? One check and one message for every path:
the Flower central node (test loss from the parties' evaluation releases), ``flower-vfl fit``
(test loss of the in-process model) and :meth:`VerticalADMM.fit` (a training-loss bound from
released values only, :func:`noise_loss_bound`). Imports only numpy."""

from __future__ import annotations

import numpy as np

__all__ = ["PrivatePartyHurts", "dp_hurts_message", "noise_divergence_cause", "noise_loss_bound", "FIX_NODE",
           "FIX_CLI", "FIX_API"]

#: how to fix it, in the words of each path's settings
FIX_NODE = ("raise the private parties' dp-lam (node config), lower their dp-train-rounds, or give them a "
            "larger dp-epsilon")
FIX_CLI = "raise --dp-lam, lower --dp-train-rounds or give them a larger --dp-epsilon"
FIX_API = ("raise the private parties' PrivacyConfig lam, lower their train_rounds, or give them a larger "
           "epsilon")


class PrivatePartyHurts(UserWarning):
    """The private parties' noise made the model worse than the non-private parties alone."""


def dp_hurts_message(loss_with, loss_without, *, measured="test loss", fix=FIX_NODE):
    """The warning text when ``loss_with`` (the model with the private parties) is above
    ``loss_without`` (the non-private parties alone, end of the warm start); else None."""
    if loss_with is None or loss_without is None or not float(loss_with) > float(loss_without):
        return None
    return (f"the private parties made the model worse: {measured} {float(loss_with):.4g} with them vs "
            f"{float(loss_without):.4g} for the non-private parties alone. Their noise outweighs their "
            f"columns at these settings: {fix}")


def noise_divergence_cause(reports: dict, fix: str = FIX_NODE) -> str | None:
    """Why a run with private parties diverged, from their privacy reports (party -> report, what
    the central node keeps): each private party's training-release noise sigma against the clip
    of its values (c_s), and what to change; None when no private party released a noisy
    training round (then the noise is not the cause)."""
    parts = []
    for m, rep in sorted((reports or {}).items()):
        train = [e for e in rep.get("ledger", {}).get("entries", []) if e.get("kind") == "train"]
        if not train:
            continue
        cfg = rep.get("config", {})
        sigma, clip = float(train[-1]["sigma"]), float(cfg.get("c_s", float("nan")))
        lam = cfg.get("lam")
        parts.append(f"party {m}'s training releases carry Gaussian noise of sigma={sigma:.4g} per value against "
                     f"values clipped to +-{clip:g} (its dp-epsilon={float(cfg.get('epsilon', float('nan'))):g} "
                     f"over {int(cfg.get('train_rounds', 0))} training and {int(cfg.get('eval_rounds', 0))} "
                     f"evaluation release(s), dp-lam={'the run' + chr(39) + 's lam' if lam is None else f'{lam:g}'})")
    if not parts:
        return None
    return ("a private party's noise at these settings: " + "; ".join(parts) + ". That noise enters z and y and "
            f"every party's next x-update; {fix} (dp-train-rounds=0: it releases only its final model)")


def noise_loss_bound(loss, f_public, t, sigma, reach, nodes=40, grid=21):
    """A lower bound on the expected training loss of the released model, from what the label
    owner holds: its labels ``t``, the public scores ``f_public`` (non-private parties' released
    s_m plus the intercept), and per private party the noise std ``sigma`` of its released x~
    and its ball radius ``reach`` (b1). A private party's rows are unit-norm (normalize_rows), so
    its score on a row is D_i x + D_i xi with |D_i x| <= b1 and D_i xi ~ N(0, sigma^2): each row
    is given its best shift u in [-sum b1, sum b1] (whatever the private columns are) and the
    noise is integrated (Gauss-Hermite). No private row, score or label is read. (An all-zero
    private row carries no noise; the bound does not model that case.)"""
    s = float(np.sqrt(np.sum(np.square(sigma))))
    b = float(np.sum(reach))
    e, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    best = None
    for u in np.linspace(-b, b, grid):
        val = sum(wk * loss.value(f_public + u + s * ek, t) for ek, wk in zip(e, w))
        best = val if best is None else np.minimum(best, val)
    return float(np.mean(best))
