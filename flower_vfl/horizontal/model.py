"""Multiclass logistic regression of paper 2 (Ryu & Kim, App. A.8), vectorized over agents.

Every function accepts a leading batch of agents (and of noise seeds): ``X`` is
``(n, J)`` for one agent or ``(P, n, J)`` for all agents padded to a common ``n``
(padding rows are all-zero and carry a zero one-hot label, so they add nothing to a
gradient, a loss or a sensitivity); ``Z`` is ``(J, K)``, ``(P, J, K)`` or ``(S, P, J, K)``.
The in-process engine and the Flower client call the same functions.

The local objective follows eq. (2c), not App. A.8's (37): f_p(z) = (1/I) sum_i l(z; x_pi,
y_pi) + (beta/P) ||z||^2 with I the *total* sample count, so that sum_p f_p is problem (1).
"""

from __future__ import annotations

import numpy as np

__all__ = ["one_hot", "softmax", "xz", "local_gradient", "local_gradient_blocks", "objective",
           "per_sample_l1", "predict", "error_rate"]


def one_hot(y, K: int) -> np.ndarray:
    """Labels ``y`` (ints in [0, K)) as a one-hot float matrix; ``-1`` (padding) -> zero row."""
    y = np.asarray(y)
    if y.size and (y.max() >= K or y.min() < -1):
        raise ValueError(f"labels must lie in [0, {K}) (or -1 for padding); got range "
                         f"[{y.min()}, {y.max()}]")
    out = np.zeros(y.shape + (K,))
    mask = y >= 0
    out[mask, y[mask]] = 1.0
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    """h_k(w; x) of App. A.8, stable (row max subtracted)."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def xz(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Logits ``X @ Z`` for every agent (and seed) in one GEMM per agent.

    X: (n, J) or (P, n, J); Z: (J, K), (P, J, K) or (S, P, J, K). Returns (..., n, K).
    Seeds are folded into the columns so that each agent does one (n x J)(J x S*K) product.
    """
    if Z.ndim == 4:
        S, P, J, K = Z.shape
        Zc = Z.transpose(1, 2, 0, 3).reshape(P, J, S * K)
        L = np.matmul(X, Zc)                                  # (P, n, S*K)
        return L.reshape(P, -1, S, K).transpose(2, 0, 1, 3)
    return np.matmul(X, Z)


def xt_r(X: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``X^T R`` per agent (and seed); the inverse of :func:`xz`'s folding."""
    if R.ndim == 4:
        S, P, n, K = R.shape
        Rc = R.transpose(1, 2, 0, 3).reshape(P, n, S * K)
        G = np.matmul(np.swapaxes(X, -1, -2), Rc)             # (P, J, S*K)
        return G.reshape(P, -1, S, K).transpose(2, 0, 1, 3)
    return np.matmul(np.swapaxes(X, -1, -2), R)


def local_gradient(Z, X, Y, I: int, beta: float, P: int, return_residual: bool = False):
    """f_p'(z_p) of eq. (37) with the 1/I of eq. (2c): (1/I) X_p^T (H - Y_p) + (2 beta / P) z_p.

    Y is one-hot (padding rows zero); I is the total sample count over all agents.
    With ``return_residual`` also returns H - Y (masked on padding rows), for eq. (20).
    """
    H = softmax(xz(X, Z))
    R = H - Y
    pad = Y.sum(axis=-1, keepdims=True) == 0                # padding rows have no label
    if pad.any():
        R = np.where(pad, 0.0, R)
    G = xt_r(X, R) / I + (2.0 * beta / P) * Z
    return (G, R) if return_residual else G


def local_gradient_blocks(Z, X_parts, Y_parts, I: int, beta: float, x_l1=None, n_agents: int | None = None):
    """:func:`local_gradient` for agents of unequal sizes, without padding (the engine's path).

    Z: (S, P, J, K); X_parts[p]: (I_p, J); Y_parts[p]: one-hot (I_p, K). Every agent does one
    (I_p x J)(J x K*S) product for its logits and one for its gradient (seeds folded into the
    columns). With ``x_l1`` (the agents' per-sample ||x_i||_1, constant over the run) also
    returns eq. (20)'s max_i ||x_i||_1 ||h_i - y_i||_1 / I per seed and agent, shape (S, P).
    Returns G (S, P, J, K) and the sensitivities (or None). ``n_agents``: the P of the
    regularizer's 2 beta / P when ``Z`` holds only some of the agents (an agent's own client
    passes its block alone); default ``Z.shape[1]``.

    The columns are ordered class-major, (k, s): the softmax over k then runs over K slabs of
    S contiguous values (SIMD over the seeds) instead of over a trailing axis of size K.
    """
    S, P, J, K = Z.shape
    reg = 2.0 * beta / (P if n_agents is None else int(n_agents))
    G = np.empty_like(Z)
    l1max = np.empty((S, P), dtype=Z.dtype) if x_l1 is not None else None
    for p in range(P):
        Xp = X_parts[p]
        Zc = Z[:, p].transpose(1, 2, 0).reshape(J, K * S)
        R = np.matmul(Xp, Zc)                                   # logits, then h - y in place
        l1 = _residual_(R.reshape(-1, K, S), Y_parts[p], None if x_l1 is None else x_l1[p])
        Gp = np.matmul(Xp.T, R).reshape(J, K, S).transpose(2, 0, 1)
        G[:, p] = Gp / I + reg * Z[:, p]
        if x_l1 is not None:
            l1max[:, p] = l1 / I
    return G, l1max


def _residual_(R, Y, x_l1=None, rows: int = 1024):
    """Logits R (n, K, S) -> h - y in place (softmax over axis 1, row max subtracted), in
    blocks of ``rows`` samples so that the passes stay in cache. With ``x_l1`` returns
    max_i ||x_i||_1 ||h_i - y_i||_1 per seed (S,) (eq. 20 without the 1/I)."""
    out = None
    for a in range(0, len(R), rows):
        r = R[a:a + rows]
        r -= r.max(axis=1, keepdims=True)
        np.exp(r, out=r)
        r /= r.sum(axis=1, keepdims=True)
        r -= Y[a:a + rows, :, None]
        if x_l1 is not None:
            m = (x_l1[a:a + rows, None] * np.abs(r).sum(axis=1)).max(axis=0)
            out = m if out is None else np.maximum(out, m)
    return out


def per_sample_l1(X, R, I: int) -> np.ndarray:
    """||(1/I) x_i (h_i - y_i)^T||_1 = ||x_i||_1 ||h_i - y_i||_1 / I for every sample (eq. 20)."""
    return np.abs(X).sum(axis=-1) * np.abs(R).sum(axis=-1) / I


def objective(W, X, y, beta: float) -> float:
    """Problem (1) at a single w: (1/I) sum_i l(w; x_i, y_i) + beta ||w||^2 (pooled data)."""
    L = X @ W
    m = L.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(L - m).sum(axis=1)))
    return float(np.mean(lse - L[np.arange(len(y)), y]) + beta * np.sum(W * W))


def predict(W, X) -> np.ndarray:
    """Class with the largest logit; W may carry leading batch axes (then (..., n)).
    A batch (S, J, K) of models is one GEMM, the models folded into the columns."""
    W = np.asarray(W)
    if W.ndim == 3:
        S, J, K = W.shape
        L = np.matmul(X, W.transpose(1, 2, 0).reshape(J, K * S)).reshape(-1, K, S)
        return L.argmax(axis=1).T
    return np.argmax(np.matmul(X, W), axis=-1)


def error_rate(W, X, y) -> np.ndarray:
    """Test error in [0, 1]; batched over W's leading axes."""
    return np.mean(predict(W, X) != np.asarray(y), axis=-1)
