"""The x-update target from a broadcast of the sum only (Alg. 1 lines 3-4 with secure aggregation).

The central node's z- and y-updates (eq. 7, 8) need only s = sum_m D_m x_m. It broadcasts

    u = z - a_hat - y / rho,      a_hat = alpha s + (1 - alpha) z_prev  (a_hat = s at alpha = 1)

with z, y the values after its update, and party m forms its eq. (6) target from u and what it
alone knows, its last release s_m (and, with over-relaxation, its share z_loc_m of z):

    v_m = x_hat_m + theta u,      x_hat_m = alpha s_m + (1 - alpha) z_loc_m,

which is today's target ``z_loc - y / rho_x`` from ``q = a_hat - z`` (PartyUpdate.step:
z_loc = x_hat - theta q, rho_x = rho / theta), since -theta q - theta y / rho = theta u. At
alpha = theta = 1 it is eq. (6)'s ``s_m + z - s - y/rho = z - sum_{k != m} s_k - y/rho``.
No party's release is needed: the central node never has to see one.
"""

from __future__ import annotations

import numpy as np

__all__ = ["broadcast_residual", "x_update_target"]


def broadcast_residual(z, a_hat, y, rho) -> np.ndarray:
    """Central node: u = z - a_hat - y / rho (one N-vector, the same for every party)."""
    return np.asarray(z, dtype=float) - np.asarray(a_hat, dtype=float) - np.asarray(y, dtype=float) / float(rho)


def x_update_target(u, s_own, theta=1.0, alpha=1.0, z_loc_own=None) -> np.ndarray:
    """Party m: v_m = x_hat_m + theta u (the eq. 6 target before the party-side clip)."""
    s_own = np.asarray(s_own, dtype=float)
    if alpha == 1.0:
        x_hat = s_own
    else:
        if z_loc_own is None:
            raise ValueError("z_loc_own: needed with alpha != 1 (x_hat = alpha s_m + (1 - alpha) z_loc_m)")
        x_hat = alpha * s_own + (1.0 - alpha) * np.asarray(z_loc_own, dtype=float)
    return x_hat + float(theta) * np.asarray(u, dtype=float)
