"""The ADMM schedule (no Flower imports): the default penalty rho, residual balancing, and the
phases of a run with private parties. The in-process engine and the Flower strategy both
read them from here."""

from __future__ import annotations

__all__ = ["default_rho", "balance_rho", "private_schedule"]


def default_rho(loss, n_samples: int, penalty="l2") -> float:
    """Default penalty: the loss is averaged over N, so its curvature is ~c/N; rho is
    set to that scale (c = the loss's curvature bound, 1 for non-smooth losses).

    Convex l: 0.2 c/N (measured on a9a (N=32561) and breast cancer: see docs/benchmarks-history.md); for
    K > 1 outputs (multinomial) c is the per-entry curvature bound (1 - 1/K)/K;
    with a non-smooth penalty ('l1', 'elasticnet') 0.2 c/(8N): rounds to a relative gap of 1e-4
    with logistic L1, a9a > 400 -> 55, breast cancer 300 -> 75 (docs/math.md Section 4).
    Nonconvex l: with L = c/N the Lipschitz constant of grad l, Assumption 1.2 of the paper
    needs gamma(rho) = rho - L > 0 (strongly convex z-update) and rho * gamma(rho) > 2 L^2,
    i.e. rho > 2L strictly (at rho = 2L the descent constant gamma/2 - L^2/rho of Lemma 4 is
    0). The default 3 c/N = 3L gives gamma/2 - L^2/rho = 2L/3 > 0. See docs/math.md.
    """
    c = loss.curvature if loss.curvature is not None else 1.0
    k = int(getattr(loss, "n_outputs", 1) or 1)
    if k > 1 and loss.convex:
        # K outputs (multinomial): the per-entry curvature bound, the mean of the diagonal of
        # diag(p) - p p^T over its K entries, (1 - sum p^2)/K <= (1 - 1/K)/K (0.25 at K = 2, the
        # logistic c). Rounds to a gap of 1e-4 / 1e-6 against 0.2 * 0.5 / N: digits (K = 10)
        # 89 / 134 -> 51 / 79, Fashion-MNIST 240 / > 300 -> 173 / 301 (docs/math.md Section 4)
        c = (1.0 - 1.0 / k) / k
    if not loss.convex:
        return 3.0 * c / n_samples
    if getattr(penalty, "name", penalty) in ("l1", "elasticnet"):
        return 0.025 * c / n_samples
    return 0.2 * c / n_samples


def balance_rho(rho, r, d, loss, n_samples, mu=10.0, tau=2.0):
    """Residual balancing (Boyd et al. 2011, Sec. 3.4.1): rho * tau when the primal residual r
    exceeds mu * d, rho / tau when d exceeds mu * r. For a nonconvex loss rho never drops below
    :func:`default_rho` (> 2c/N, where the z-update stays strongly convex)."""
    new = rho * tau if r > mu * d else rho / tau if d > mu * r else rho
    return new if loss.convex else max(new, default_rho(loss, n_samples))


def private_schedule(private, max_rounds, private_train_rounds):
    """Phases of a run as ``[(rounds, active_mask, use_tol), ...]``.

    Without private parties: one phase of ``max_rounds`` with every party. With private
    parties (see docs/privacy.md, "Protocol"):

    1. warm start: the non-private parties and the label owner's intercept run ADMM sharing
       for up to ``max_rounds`` (the stopping rule applies); private parties release
       nothing and keep x_m = 0;
    2. ``min(private_train_rounds)`` rounds with every party, private ones releasing noisy
       s_m (0 rounds is allowed and is usually best: see docs/privacy.md);
    3. (done by the caller) one final x-update of each private party from the last
       message, never released on training rows; evaluation releases use it.
    """
    everyone = [True] * len(private)
    if not any(private):
        return [(int(max_rounds), everyone, True)]
    t_private = int(min(private_train_rounds))
    return [(int(max_rounds), [not p for p in private], True), (t_private, everyone, False)]
