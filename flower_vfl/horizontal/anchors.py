"""Anchors a user would pick instead of DP inexact ADMM, on the same splits and model.

- :func:`fedavg`: FedAvg (McMahan et al.) over the same multiclass LR, non-private: each
  round every agent runs ``local_epochs`` of minibatch SGD on its own data from w, the
  server averages weighted by I_p. In process (Flower's FedAvg runs the same arithmetic).
- :func:`dpsgd_fedavg`: the same loop where every agent trains with opacus' DP-SGD
  (Poisson sampling, per-sample clipping, Gaussian noise) and reports the epsilon of *its
  own* opacus accountant (RDP) after all its local steps. opacus/torch are imported lazily
  (the ``opacus`` extra).
"""

from __future__ import annotations

import numpy as np

from flower_vfl.horizontal.model import error_rate, softmax

__all__ = ["fedavg", "dpsgd_fedavg"]


def fedavg(X_parts, y_parts, K, rounds=20, local_epochs=1, lr=0.05, batch_size=64, beta=1e-6, seed=0,
           X_test=None, y_test=None):
    """Non-private FedAvg on multiclass LR; returns (W, history of test errors per round)."""
    rng = np.random.default_rng(seed)
    J = X_parts[0].shape[1]
    n_p = np.array([len(y) for y in y_parts], float)
    W = np.zeros((J, K))
    hist = []
    for r in range(1, rounds + 1):
        locals_ = []
        for Xp, yp in zip(X_parts, y_parts):
            Wl = W.copy()
            Yp = np.eye(K)[yp]
            for _ in range(local_epochs):
                order = rng.permutation(len(yp))
                for s in range(0, len(yp), batch_size):
                    b = order[s:s + batch_size]
                    G = Xp[b].T @ (softmax(Xp[b] @ Wl) - Yp[b]) / len(b) + 2 * beta * Wl
                    Wl -= lr * G
            locals_.append(Wl)
        W = np.tensordot(n_p / n_p.sum(), np.stack(locals_), axes=1)
        if X_test is not None:
            hist.append({"round": r, "test_error": float(error_rate(W, X_test, y_test))})
    return W, hist


def dpsgd_fedavg(X_parts, y_parts, K, target_epsilon, delta=1e-5, rounds=10, local_epochs=1, lr=0.5,
                 batch_size=256, max_grad_norm=1.0, seed=0, X_test=None, y_test=None):
    """FedAvg of opacus DP-SGD agents; each agent calibrates its noise to ``target_epsilon``
    over all its local epochs (rounds * local_epochs) and reports its accountant's epsilon.

    Returns (W, history, per-agent epsilons spent at ``delta``)."""
    import torch
    from opacus import PrivacyEngine
    from opacus.accountants.utils import get_noise_multiplier

    torch.manual_seed(seed)
    J = X_parts[0].shape[1]
    n_p = np.array([len(y) for y in y_parts], float)
    W = np.zeros((J, K))
    agents = []
    for p, (Xp, yp) in enumerate(zip(X_parts, y_parts)):
        q = min(1.0, batch_size / len(yp))
        steps = int(round(rounds * local_epochs / q))
        sigma = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=q,
                                     steps=steps, accountant="rdp")
        model = torch.nn.Linear(J, K, bias=False).double()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ds = torch.utils.data.TensorDataset(torch.from_numpy(Xp), torch.from_numpy(np.asarray(yp, dtype=np.int64)))
        dl = torch.utils.data.DataLoader(ds, batch_size=batch_size)
        engine = PrivacyEngine(accountant="rdp")
        gen = torch.Generator().manual_seed(seed * 1000 + p)
        model, opt, dl = engine.make_private(module=model, optimizer=opt, data_loader=dl, noise_multiplier=sigma,
                                             max_grad_norm=max_grad_norm, noise_generator=gen)
        agents.append((model, opt, dl, engine))
    loss_fn = torch.nn.CrossEntropyLoss()
    hist = []
    for r in range(1, rounds + 1):
        locals_ = []
        for model, opt, dl, _ in agents:
            with torch.no_grad():
                model._module.weight.copy_(torch.from_numpy(W.T.copy()))
            for _ in range(local_epochs):
                for xb, yb in dl:
                    if len(yb) == 0:
                        continue
                    opt.zero_grad()
                    loss_fn(model(xb), yb).backward()
                    opt.step()
            locals_.append(model._module.weight.detach().numpy().T.copy())
        W = np.tensordot(n_p / n_p.sum(), np.stack(locals_), axes=1)
        if X_test is not None:
            hist.append({"round": r, "test_error": float(error_rate(W, X_test, y_test))})
    eps = [float(engine.get_epsilon(delta)) for *_, engine in agents]
    return W, hist, eps
