"""One iteration of DP inexact ADMM (paper 2, Algorithms 1-2) and the OutP baseline.

Pure functions over arrays with a leading agent axis (and optionally a seed axis before
it), shared by the in-process engine and the Flower glue:

- :func:`server_step`   eq. (4a): w = (1/P) sum_p (z_p - lambda_p / rho_t)
- :func:`objp_step`     eq. (8) + (10), eta_t = a / sqrt(t), box W (closed form: clip)
- :func:`objt_step`     eq. (9) + (10), infinity-norm trust region delta_t = a / t^2
- :func:`outp_step`     Huang et al. (2019): linearized proximal step with eta_hat_t, then
                        Gaussian output perturbation z~ = z + N(0, sigma_t^2 I)
- :func:`dual_step`     eq. (4c): lambda_p += rho_t (w - z_p)
- :func:`rho_schedule`  eq. (21)

Noise is *drawn by the caller* (the agent, from its own generator) as standard Laplace /
standard normal arrays and passed in with the scale computed here, so that the scale
computation can be audited and the draw kept on the agent's side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DPIADMMParams", "VARIANTS", "rho_schedule", "server_step", "dual_step",
           "laplace_scale", "outp_constants", "outp_eta", "outp_sigma", "objp_step", "objt_step", "outp_step",
           "agent_update"]

VARIANTS = ("objp", "objt", "outp")


@dataclass(frozen=True)
class DPIADMMParams:
    """Hyper-parameters of one run (paper 2's MNIST defaults).

    Parameters
    ----------
    variant : {'objp', 'objt', 'outp'}
    eps_bar : float or None, default=None
        Per-iteration privacy parameter; None runs without noise (non-private).
    a : float, default=1.0
        Scale of eta_t = a/sqrt(t) (ObjP) and delta_t = a/t^2 (ObjT) (App. A.11).
    beta : float, default=1e-6
        Regularizer weight of eq. (1).
    box : float, default=1.0
        W = [-box, box]^{J x K} (the authors' code uses [-1, 1]).
    c1, c2, Tc, rho_max : float, default=2, 5, 1e4, 1e9
        eq. (21), MNIST constants (App. A.9).
    delta_bar : float, default=1e-6
        OutP's per-iteration delta.
    sensitivity : {'eq20', 'replace'}, default='eq20'
        'eq20': the paper's data-dependent max_i ||x_i||_1 ||h_i - y_i||_1 / I (eq. 20, with 1/I);
        'replace': a data-independent bound for replacing one sample with any
        (x', y'), x' in [0, 1]^J: 4 * x_l1_max / I (docs/reproduction-horizontal.md).
    x_l1_max : float or None, default=None
        Bound on ||x||_1 for 'replace' (default J, pixels in [0, 1]); ||x||_2^2 <= ||x||_1
        on [0, 1]^J also bounds OutP's per-sample gradient.
    trust : {'paper', 'constant'}, default='paper'
        ObjT's radius: 'paper' delta_t = a/t^2 (eq. 9 as printed; summable, so z_p can move
        at most a*pi^2/6 in total), 'constant' delta_t = a (what the authors' code does).
    """

    variant: str = "objt"
    eps_bar: float | None = None
    a: float = 1.0
    beta: float = 1e-6
    box: float = 1.0
    c1: float = 2.0
    c2: float = 5.0
    Tc: float = 1e4
    rho_max: float = 1e9
    delta_bar: float = 1e-6
    sensitivity: str = "eq20"
    x_l1_max: float | None = None
    trust: str = "paper"

    def validate(self) -> "DPIADMMParams":
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r}; choose one of {VARIANTS}")
        if self.eps_bar is not None and not (self.eps_bar > 0 and math.isfinite(self.eps_bar)):
            raise ValueError(f"eps_bar={self.eps_bar!r}; give a positive finite float, or None "
                             "for a non-private run")
        for name in ("a", "box", "c1", "Tc", "rho_max"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}; must be > 0")
        if self.beta < 0 or self.c2 < 0:
            raise ValueError(f"beta={self.beta!r}, c2={self.c2!r}; both must be >= 0")
        if not 0 < self.delta_bar < 1:
            raise ValueError(f"delta_bar={self.delta_bar!r}; must lie in (0, 1)")
        if self.sensitivity not in ("eq20", "replace"):
            raise ValueError(f"sensitivity={self.sensitivity!r}; choose 'eq20' or 'replace'")
        if self.trust not in ("paper", "constant"):
            raise ValueError(f"trust={self.trust!r}; choose 'paper' (a/t^2) or 'constant' (a)")
        return self

    @property
    def private(self) -> bool:
        return self.eps_bar is not None


def rho_schedule(t: int, p: DPIADMMParams) -> float:
    """eq. (21): rho_t = min{rho_max, c1 * 1.2^floor(t/Tc) + c2/eps_bar} (c2/eps_bar = 0 when
    non-private)."""
    extra = 0.0 if p.eps_bar is None else p.c2 / p.eps_bar
    return float(min(p.rho_max, p.c1 * 1.2 ** math.floor(t / p.Tc) + extra))


def server_step(Z: np.ndarray, Lam: np.ndarray, rho: float) -> np.ndarray:
    """eq. (4a): w^{t+1} = (1/P) sum_p (z_p^t - lambda_p^t / rho_t); agent axis = -3."""
    return np.mean(Z - Lam / rho, axis=-3)


def dual_step(Lam: np.ndarray, W: np.ndarray, Z: np.ndarray, rho: float) -> np.ndarray:
    """eq. (4c): lambda_p^{t+1} = lambda_p^t + rho_t (w^{t+1} - z_p^{t+1})."""
    return Lam + rho * (W[..., None, :, :] - Z) if W.ndim == Z.ndim - 1 else Lam + rho * (W - Z)


def laplace_scale(l1_per_sample: np.ndarray, p: DPIADMMParams, I: int, J: int) -> np.ndarray:
    """Laplace scale b = Delta / eps_bar per agent, Delta from eq. (20) (with 1/I) or the
    'replace' bound; eq. (11a) has density (eps/2Delta) exp(-eps |xi| / Delta) per coordinate."""
    if p.sensitivity == "eq20":
        delta = l1_per_sample.max(axis=-1)                   # eq. (20): max over own samples
    else:
        bx = float(J if p.x_l1_max is None else p.x_l1_max)
        delta = np.full(l1_per_sample.shape[:-1], 4.0 * bx / I)
    return delta / p.eps_bar, delta


def outp_constants(n_p, I: int, J: int, p: DPIADMMParams):
    """Huang et al.'s constants for our f_p (eq. 2c), from public bounds only.

    c1 bounds ||grad l(w; x_i, y_i)||_2 = ||x_i||_2 ||h_i - y_i||_2 <= x_l2_max * sqrt(2);
    c3 (f_p's smoothness) = (I_p / I) x_l2_max^2 / 2 + 2 beta / P_ (softmax Hessian <= 1/2).
    x_l2_max defaults to sqrt(J) (pixels in [0, 1]). Returns (c1, c3) with c3 per agent.
    """
    xl2 = math.sqrt(J if p.x_l1_max is None else min(J, p.x_l1_max))
    c1 = math.sqrt(2.0) * xl2
    c3 = np.asarray(n_p, dtype=float) / I * xl2 ** 2 / 2.0 + 2.0 * p.beta
    return c1, c3


def outp_eta(t: int, p: DPIADMMParams, c1_grad: float, c3, I: int, J: int, K: int):
    """Huang et al.'s proximity: 1/eta_hat_t = c3 + 4 c1 sqrt(JK t ln(1.25/delta)) / (I eps c_w).

    c_w is the diameter of W (2 box sqrt(JK)); I is the 1/I of our f_p (eq. 2c). Non-private:
    the eps-term vanishes. ``c3`` may be an array (one per agent).
    """
    cw = 2.0 * p.box * math.sqrt(J * K)
    extra = 0.0 if p.eps_bar is None else \
        4.0 * c1_grad * math.sqrt(J * K * t * math.log(1.25 / p.delta_bar)) / (I * p.eps_bar * cw)
    return 1.0 / (np.asarray(c3, dtype=float) + extra)


def outp_sigma(rho: float, eta, p: DPIADMMParams, c1_grad: float, I: int):
    """Standard deviation (not its square) of OutP's Gaussian noise at one iteration, per agent.

    The unconstrained update z = (rho w + lambda - g + z^t/eta)/(rho + 1/eta) changes by at
    most 2 c1 / (I (rho + 1/eta)) in L2 when one sample is replaced (the projection on the box
    is non-expansive); sigma = Delta_2 sqrt(2 ln(1.25/delta_bar)) / eps_bar.
    Returns (sigma, Delta_2).
    """
    delta2 = 2.0 * c1_grad / (I * (rho + 1.0 / np.asarray(eta)))
    return delta2 * math.sqrt(2.0 * math.log(1.25 / p.delta_bar)) / p.eps_bar, delta2


def _clip(v, lo, hi):
    return np.minimum(np.maximum(v, lo), hi)


def objp_step(Zt, G, W, Lam, xi, rho: float, t: int, p: DPIADMMParams):
    """eq. (8) with (10) over the box: argmin <G, z> + rho/2 ||w - z + (lam - xi)/rho||^2
    + ||z - z^t||^2 / (2 eta_t); the objective is separable with identity curvature, so the
    box-constrained minimizer is the clipped unconstrained one."""
    eta = p.a / math.sqrt(t)
    z = (rho * W + Lam - xi - G + Zt / eta) / (rho + 1.0 / eta)
    return _clip(z, -p.box, p.box)


def objt_step(Zt, G, W, Lam, xi, rho: float, t: int, p: DPIADMMParams):
    """eq. (9) with (10): argmin <G, z> + rho/2 ||w - z + (lam - xi)/rho||^2 over
    W ∩ {||z - z^t||_inf <= delta_t}, delta_t = a/t^2: clip to the intersected box."""
    delta = p.a / float(t) ** 2 if p.trust == "paper" else p.a
    z = W + (Lam - xi - G) / rho
    return _clip(z, np.maximum(Zt - delta, -p.box), np.minimum(Zt + delta, p.box))


def outp_step(Zt, G, W, Lam, noise, rho: float, eta: float):
    """Huang et al. (2019): z = Pi_W[(rho w + lam - g + z^t/eta) / (rho + 1/eta)] (box handled by
    the caller via ``agent_update``), then z~ = z + noise (noise already scaled by sigma_t)."""
    return (rho * W + Lam - G + Zt / eta) / (rho + 1.0 / eta)


def agent_update(Zt, Lam, W, G, l1_per_sample, std_draw, rho: float, t: int, p: DPIADMMParams,
                 I: int, c1_grad: float = 0.0, c3=0.0):
    """Agent step for any variant, vectorized over leading axes (agents last among them).

    ``std_draw`` is a standard Laplace (ObjP/ObjT) or standard normal (OutP) array with the
    shape of Zt (ignored when non-private). Returns (z_new, info) where info holds the noise
    scale and sensitivity used (per agent) and the mean |noise| (Fig. 1 top).
    """
    J, K = Zt.shape[-2:]
    info = {}
    if p.variant in ("objp", "objt"):
        if p.private:
            b, delta = laplace_scale(l1_per_sample, p, I, J)
            xi = np.asarray(b)[..., None, None] * std_draw
            info.update(scale=b, sensitivity=delta, noise_abs_mean=np.abs(xi).mean(axis=(-2, -1)))
        else:
            xi = 0.0
        step = objp_step if p.variant == "objp" else objt_step
        return step(Zt, G, W, Lam, xi, rho, t, p), info
    eta = outp_eta(t, p, c1_grad, c3, I, J, K)
    eta_b = np.asarray(eta)[..., None, None]
    z = _clip(outp_step(Zt, G, W, Lam, None, rho, eta_b), -p.box, p.box)
    info["eta"] = eta
    if p.private:
        sigma, delta2 = outp_sigma(rho, eta, p, c1_grad, I)
        noise = np.broadcast_to(np.asarray(sigma)[..., None, None], Zt.shape) * std_draw
        z = z + noise
        info.update(scale=np.broadcast_to(sigma, Zt.shape[:-2]), sensitivity=np.broadcast_to(delta2, Zt.shape[:-2]),
                    noise_abs_mean=np.abs(noise).mean(axis=(-2, -1)))
    return z, info
