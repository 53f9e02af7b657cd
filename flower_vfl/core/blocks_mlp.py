"""The MLP party block (torch, imported lazily: the ``opacus`` extra installs it). No Flower imports.

f_m(D_m; theta) is a ReLU network with K outputs (K = 1 for a scalar loss). The party's x-update
(eq. 6 with any block) is ``min_theta lam/2 ||theta||^2 + (rho_x/2) ||f_m(D_m; theta) - v||^2``,
``rho_x = rho / theta_damping`` (the variant's proximal term), solved inexactly: ``epochs`` passes
of Adam over minibatches, warm-started from the last round's network and optimizer state, at the
learning rate ``lr * lr_decay^(k-1)`` in round k (a function of the round counter alone, so the
inexact solves settle as the rounds go). It is deterministic given ``party-model-seed``: the
initialization from ``torch.manual_seed`` inside a forked RNG, the minibatch order from a generator
seeded by (seed, round), one thread.

Non-private parties only (:func:`flower_vfl.core.blocks.block_from_config` refuses a private one by
name): no accountant here covers a network's training.
"""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.sparse as sp

from flower_vfl.core.block_base import PartyBlock
from flower_vfl.core.party import Releases, x_update_target

__all__ = ["MLPBlock", "MLPUpdate", "torch_or_refuse"]


def torch_or_refuse():
    """torch (:func:`flower_vfl.core.blocks.block_from_config` has refused the kind by name, with the
    extra to install, when it is missing)."""
    import torch
    return torch


@contextlib.contextmanager
def _one_thread(torch):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _network(torch, d_in, width, layers, n_out, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        mods, d = [], d_in
        for _ in range(layers):
            mods += [torch.nn.Linear(d, width), torch.nn.ReLU()]
            d = width
        mods.append(torch.nn.Linear(d, n_out))
        return torch.nn.Sequential(*mods)


class MLPBlock(PartyBlock):
    """The 'mlp' kind: no feature map (:class:`~flower_vfl.core.block_base.PartyBlock`'s identity
    ``fit`` / ``features``); the party's update is :class:`MLPUpdate`, its prediction the network's
    forward pass."""

    kind = "mlp"
    nonlinear = True

    def __init__(self, settings):
        super().__init__(settings)      # every mlp setting, defaults filled (core/blocks.py)
        self.n_out = 1

    def net(self, n_out=None):
        torch = torch_or_refuse()
        s = self.settings
        return _network(torch, self.d_in, int(s["party-model-width"]), int(s["party-model-layers"]),
                        int(n_out or self.n_out), int(s["party-model-seed"]))

    def make_update(self, D, lam, n_outputs=1):
        self.n_out = int(n_outputs)
        return MLPUpdate(self, D, lam, n_outputs)

    def predict(self, D, x):
        """f_m(D; x), x the flat parameter vector (``coef_``); (N,) or (N, K)."""
        torch = torch_or_refuse()
        x = np.asarray(x, dtype=float)
        net = self.net()
        with _one_thread(torch), torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.as_tensor(x, dtype=torch.float32), net.parameters())
            out = net(_tensor(torch, D)).double().numpy()
        return out[:, 0] if self.n_out == 1 else out

    def to_meta(self) -> dict:
        return {**super().to_meta(), "n_out": self.n_out}

    def describe(self) -> str:
        """The kind and every setting (what the party tells the central node at identify)."""
        shown = ", ".join(f"{k.replace('party-model-', '')}={v}" for k, v in sorted(self.settings.items()))
        return f"mlp ({shown})"


def _tensor(torch, D):
    D = D.toarray() if sp.issparse(D) else np.asarray(D)
    return torch.as_tensor(np.ascontiguousarray(D, dtype=np.float32))


class _Penalty:
    name = "l2"

    def __init__(self, upd):
        self.upd = upd

    def value(self, x):
        return 0.5 * float(np.dot(np.ravel(x), np.ravel(x)))


class _Solver:
    """What the round driver reads of a party's solver: ``lam`` and ``penalty`` (no factorization
    to keep: the Flower party's state is :meth:`MLPUpdate.get_state`)."""

    def __init__(self, upd, lam):
        self.lam, self.penalty, self.method_ = float(lam), _Penalty(upd), "mlp"

    def factorization(self):
        return None


class MLPUpdate(Releases):
    """The x-update of an MLP party (the release interface of :class:`~flower_vfl.core.party.PartyUpdate`:
    ``train_release``, ``commit``, ``penalty_value``, ``x``, ``s``): a few warm-started Adam epochs
    toward v each round, the learning rate decayed by ``party-model-lr-decay`` a round."""

    def __init__(self, block, D, lam, n_outputs=1):
        torch = torch_or_refuse()
        self.torch, self.block, self.lam = torch, block, float(lam)
        self.n = int(D.shape[0])
        self.K = int(n_outputs)
        self.Dt = _tensor(torch, D)
        self.net = block.net(self.K)
        s = block.settings
        self.epochs, self.batch = int(s["party-model-epochs"]), int(s["party-model-batch"])
        self.seed = int(s["party-model-seed"])
        self.lr, self.lr_decay = float(s["party-model-lr"]), float(s.get("party-model-lr-decay", 1.0))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        self.solver = _Solver(self, lam)
        shape = (self.n,) if self.K == 1 else (self.n, self.K)
        self.s = np.zeros(shape)
        self.z_loc = np.zeros(shape)
        self.rho_x = None
        self.rounds = 0
        self.s = self._forward()      # the initial network's scores: what the party holds before round 1

    @property
    def x(self):
        return self.torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().double().numpy().copy()

    def _forward(self):
        with _one_thread(self.torch), self.torch.no_grad():
            out = self.net(self.Dt).double().numpy()
        return out[:, 0].copy() if self.K == 1 else out

    def plain_rounds(self):
        pass

    def step(self, q, y, rho, alpha=1.0, theta=1.0, v=None, q_norm=None):
        torch = self.torch
        if alpha != 1.0:
            raise ValueError(f"party-model='mlp' takes alpha = 1 (got alpha={alpha!r})")
        rho_x = rho / theta
        if v is None:
            self.z_loc, v = x_update_target(self.s, q, y, rho, theta)
        vt = torch.as_tensor(np.asarray(v, dtype=np.float32).reshape(self.n, self.K))
        # (rho_x/2)||f - v||^2 + (lam/2)||theta||^2, divided by rho_x N / 2: a mean over rows
        wd = self.lam / (rho_x * self.n)
        self.rounds += 1
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rounds)
        if self.lr_decay != 1.0:        # the round's learning rate: a function of the round counter alone
            for g in self.opt.param_groups:
                g["lr"] = self.lr * self.lr_decay ** (self.rounds - 1)
        with _one_thread(torch):
            for _ in range(self.epochs):
                perm = torch.randperm(self.n, generator=gen)
                for i in range(0, self.n, self.batch):
                    idx = perm[i:i + self.batch]
                    self.opt.zero_grad()
                    diff = self.net(self.Dt[idx]) - vt[idx]
                    loss = (diff * diff).sum(dim=1).mean()
                    if wd > 0:
                        loss = loss + wd * sum((p * p).sum() for p in self.net.parameters())
                    loss.backward()
                    self.opt.step()
        self.rho_x = float(rho_x)
        return self._forward()

    def get_state(self) -> dict:
        """What the next x-update needs, as arrays (the Flower party keeps them in the run's
        context.state, a large one in its state folder: clients/party_public.py): the network's
        parameters ``x`` (float32 values, exact in float64), Adam's moments and step, the round
        counter that seeds the minibatch order, the last release ``s`` (rebuilt by
        :meth:`set_state` from ``x`` when left out: the same forward pass, bitwise) and z_loc."""
        state = {"x": self.x, "s": self.s, "z_loc": self.z_loc, "rounds": np.array([self.rounds], dtype=np.int64)}
        if self.rho_x is not None:
            state["rho_x"] = np.array([self.rho_x])
        params = list(self.net.parameters())
        if params and params[0] in self.opt.state and self.opt.state[params[0]]:
            st = [self.opt.state[p] for p in params]
            state["adam_m"] = np.concatenate([t["exp_avg"].detach().numpy().ravel() for t in st])
            state["adam_v"] = np.concatenate([t["exp_avg_sq"].detach().numpy().ravel() for t in st])
            state["adam_step"] = np.array([float(st[0]["step"])])
        return state

    def set_state(self, state: dict):
        """Restore :meth:`get_state` (``{}``: a run's start, the seeded initial network): the next
        step is bitwise the one the in-process engine takes from the same state."""
        torch = self.torch
        if "x" in state:
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(
                    torch.as_tensor(np.asarray(state["x"], dtype=np.float32).ravel()), self.net.parameters())
        if "adam_step" in state:
            m = torch.as_tensor(np.asarray(state["adam_m"], dtype=np.float32).ravel())
            v = torch.as_tensor(np.asarray(state["adam_v"], dtype=np.float32).ravel())
            step = float(np.asarray(state["adam_step"]).ravel()[0])
            i = 0
            for p in self.net.parameters():
                k = p.numel()
                self.opt.state[p] = {"step": torch.tensor(step), "exp_avg": m[i:i + k].view_as(p).clone(),
                                     "exp_avg_sq": v[i:i + k].view_as(p).clone()}
                i += k
        if "rounds" in state:
            self.rounds = int(np.asarray(state["rounds"]).ravel()[0])
        if "rho_x" in state:
            self.rho_x = float(np.asarray(state["rho_x"]).ravel()[0])
        shape = self.s.shape
        if "z_loc" in state:
            self.z_loc = np.asarray(state["z_loc"], dtype=float).reshape(shape)
        self.s = np.asarray(state["s"], dtype=float).reshape(shape) if "s" in state else self._forward()

    def eval_release(self, round, rho=None, theta=None, D_eval=None):
        return self.block.predict(D_eval, self.x)

    def penalty_value(self):
        return _Penalty(self).value(self.x)
