"""Independent centralized solvers of the same objective (scipy / scikit-learn)."""

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_expit, logsumexp, expit


def smooth_loss(name, f, t):
    """(value per mean, gradient wrt f) for the scalar smooth losses."""
    n = f.shape[0]
    if name == "logistic":
        return -log_expit(t * f).mean(), -t * expit(-t * f) / n
    if name == "squared":
        return 0.5 * np.mean((f - t) ** 2), (f - t) / n
    if name == "sigmoid":
        p = expit(-t * f)
        return p.mean(), -t * p * (1 - p) / n
    raise ValueError(name)


def centralized(X, t, loss, lam, penalty="l2", l1_ratio=0.5, bounds=None, ball=None):
    """min (1/N) sum l(X w + b) + lam R(w); returns (w, b, objective). L-BFGS-B, split variables for l1."""
    n, d = X.shape
    a = {"l2": 0.0, "l1": 1.0, "elasticnet": l1_ratio}[penalty]

    def unpack(p):
        if a > 0:
            return p[:d] - p[d:2 * d], p[-1]
        return p[:d], p[-1]

    def fun(p):
        w, b = unpack(p)
        val, g = smooth_loss(loss, X @ w + b, t)
        gw = X.T @ g
        val += lam * ((1 - a) * 0.5 * w @ w)
        gw = gw + lam * (1 - a) * w
        if a > 0:
            pos, neg = p[:d], p[d:2 * d]
            val += lam * a * (pos.sum() + neg.sum())
            return val, np.concatenate([gw + lam * a, -gw + lam * a, [g.sum()]])
        return val, np.concatenate([gw, [g.sum()]])

    if ball is not None:
        radius, groups = ball          # one ball per party block, as X_m in the paper

        def con(lo, hi):
            def f(p):
                return radius ** 2 - p[lo:hi] @ p[lo:hi]

            def j(p):
                g = np.zeros(d + 1)
                g[lo:hi] = -2 * p[lo:hi]
                return g
            return {"type": "ineq", "fun": f, "jac": j}
        cons = [con(lo, hi) for lo, hi in groups]
        res = minimize(fun, np.zeros(d + 1), jac=True, method="SLSQP", constraints=cons,
                       options={"ftol": 1e-15, "maxiter": 5000})
    else:
        nvar = 2 * d + 1 if a > 0 else d + 1
        bnds = [(0, None)] * (2 * d) + [(None, None)] if a > 0 else (
            [bounds] * d + [(None, None)] if bounds else None)
        res = minimize(fun, np.zeros(nvar), jac=True, method="L-BFGS-B", bounds=bnds,
                       options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000, "maxcor": 50})
    w, b = unpack(res.x)
    return w, b, fun(res.x)[0]


def multinomial(X, yk, lam):
    """Softmax regression with unpenalized intercepts; yk one-hot (N, K)."""
    n, d = X.shape
    K = yk.shape[1]

    def fun(p):
        W, b = p[:d * K].reshape(d, K), p[d * K:]
        F = X @ W + b
        val = np.mean(logsumexp(F, axis=1) - np.sum(F * yk, axis=1)) + lam * 0.5 * np.sum(W * W)
        G = (np.exp(F - logsumexp(F, axis=1)[:, None]) - yk) / n
        return val, np.concatenate([(X.T @ G + lam * W).ravel(), G.sum(axis=0)])

    res = minimize(fun, np.zeros(d * K + K), jac=True, method="L-BFGS-B",
                   options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000, "maxcor": 50})
    return res.x[:d * K].reshape(d, K), res.x[d * K:], fun(res.x)[0]


def breast_cancer_blocks():
    """sklearn breast cancer, standardized, labels in {-1, +1}, in 3 column blocks (0:10, 10:20,
    20:30): ``(X, Y, blocks)``, the data of the exactness tests."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    return X, np.where(y == 1, 1.0, -1.0), [X[:, :10], X[:, 10:20], X[:, 20:]]
