"""Noisy release of a party's contribution ``s_m = D_m x_m``.

Two forms:

``"output"`` (default)
    The Gaussian mechanism on the released vector: ``s̃ = s + e``, ``e ~ N(0, σ² I)``.
    With ``σ = z C`` for L2 sensitivity ``C`` this is (ε, δ)-DP as accounted in
    :mod:`flower_vfl.privacy.accounting`.
``"paper"``
    The paper's parameter-space noise (eq. 16): ``ξ ~ N(0, σ² (DᵀD)⁻¹)``, release
    ``D (x + ξ)``. That release lies in col-space(D); a neighbouring D' has a
    different column space, so the two output distributions have disjoint supports
    and the release is **not (ε, δ)-DP for any δ < 1** by itself. Kept, labelled,
    only to reproduce the paper's figures.

The mechanism only draws noise: it keeps no record of what it released. Charging a release
and answering a re-sent request from the stored answer (never a second draw) are the party's
ledger's job (:class:`flower_vfl.privacy.ledger.Ledger`).

Randomness never touches global numpy state. By default (``seed=None``) every draw takes
fresh entropy from the OS CSPRNG (``os.urandom`` via ``SeedSequence()``) that is used once
and never stored, so nobody, the party included, can re-derive a noise vector. This is the
only mode a party's ClientApp uses. An explicit ``seed`` exists for in-process experiments
(:class:`~flower_vfl.privacy.party.PrivacyConfig` ``seed``, the figures' scripts): each
(party, round, kind) then has the stream ``SeedSequence(entropy=seed, spawn_key=(party,
round, kind_code))``, the same in every run, so noise keyed that way would cancel between
two runs of a party; a Flower party refuses it (docs/privacy.md, "Trust model").
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import TYPE_CHECKING

import numpy as np
import scipy.linalg

from flower_vfl.privacy.accounting import dpa

if TYPE_CHECKING:
    import dp_accounting

__all__ = ["FORMS", "KIND_CODES", "GaussianOutputMechanism"]

FORMS = ("output", "paper")
KIND_CODES = {"train": 0, "eval": 1}


def _party_key(party_id) -> int:
    if isinstance(party_id, numbers.Integral) and not isinstance(party_id, bool) and party_id >= 0:
        return int(party_id)
    if isinstance(party_id, str):
        return int.from_bytes(hashlib.sha256(party_id.encode()).digest()[:8], "little")
    raise ValueError(f"party_id={party_id!r} must be an integer >= 0 or a string")


class GaussianOutputMechanism:
    """Gaussian noise for a party's releases (fresh OS entropy, or a seed's stream in-process).

    Parameters
    ----------
    sigma : float
        Noise standard deviation σ (> 0), e.g. from :func:`~flower_vfl.privacy.calibrate_sigma`.
    party_id : int or str
        The party; strings are hashed to an integer stream key.
    seed : int or None, default=None
        In-process experiments only (reproducible streams); None: fresh OS entropy per draw.
    form : {"output", "paper"}, default="output"
        See the module docstring; only ``"output"`` is differentially private.
    jitter : float, default=1e-10
        Relative ridge added to DᵀD before its Cholesky factorisation ("paper" form).
    """

    def __init__(self, sigma, party_id, seed=None, form="output", jitter=1e-10):
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not (
            math.isfinite(sigma) and sigma > 0
        ):
            raise ValueError(f"sigma={sigma!r} must be a finite real number > 0")
        if form not in FORMS:
            raise ValueError(f"form={form!r} is not supported; accepted values: {FORMS}")
        self.sigma = float(sigma)
        self.party_id = party_id
        self._party_key = _party_key(party_id)
        self.seed = None if seed is None else int(seed)
        self.form = form
        self.jitter = float(jitter)

    # ------------------------------------------------------------------ randomness

    def rng(self, round: int, kind: str = "train") -> np.random.Generator:
        """The stream for (party, round, kind): fresh OS entropy, or the party's seed's stream."""
        if kind not in KIND_CODES:
            raise ValueError(f"kind={kind!r} is not supported; accepted values: {tuple(KIND_CODES)}")
        if isinstance(round, bool) or not isinstance(round, numbers.Integral) or round < 0:
            raise ValueError(f"round={round!r} must be an integer >= 0")
        if self.seed is None:
            return np.random.default_rng(np.random.SeedSequence())     # os.urandom, used once
        seq = np.random.SeedSequence(
            entropy=self.seed, spawn_key=(self._party_key, int(round), KIND_CODES[kind])
        )
        return np.random.default_rng(seq)

    def output_noise(self, round: int, kind: str, shape) -> np.ndarray:
        """e ~ N(0, σ² I) of the given shape for (round, kind)."""
        return self.sigma * self.rng(round, kind).standard_normal(shape)

    def parameter_noise(self, round: int, kind: str, D: np.ndarray, n_cols: int | None = None):
        """ξ ~ N(0, σ² (DᵀD)⁻¹) (eq. 16), shape (d,) or (d, n_cols)."""
        D = np.asarray(D, dtype=float)
        gram = D.T @ D
        d = gram.shape[0]
        ridge = self.jitter * max(np.trace(gram) / max(d, 1), np.finfo(float).tiny)
        L = np.linalg.cholesky(gram + ridge * np.eye(d))
        shape = (d,) if n_cols is None else (d, n_cols)
        g = self.rng(round, kind).standard_normal(shape)
        # L Lᵀ = DᵀD  =>  Cov(L⁻ᵀ g) = (L Lᵀ)⁻¹
        return self.sigma * scipy.linalg.solve_triangular(L, g, trans="T", lower=True)

    # ------------------------------------------------------------------ release

    def release(self, s=None, *, round: int, kind: str = "train", D=None, x=None) -> np.ndarray:
        """The noisy release for (round, kind): a fresh draw at every call (with a seed, the
        seed's stream for (round, kind)).

        Parameters
        ----------
        s : array of shape (N,) or (N, K)
            Exact ``D x`` ("output" form; ignored by "paper", which needs ``D`` and ``x``).
        round : int
            Round number (>= 0).
        kind : {"train", "eval"}
        D, x : arrays, "paper" form only
            Local data (N, d) and parameters (d,) or (d, K).
        """
        if self.form == "output":
            if s is None:
                raise ValueError("s (the exact D @ x) is required for form='output'")
            s = np.asarray(s, dtype=float)
            if s.ndim not in (1, 2):
                raise ValueError(f"s must have shape (N,) or (N, K), got shape {s.shape}")
            released = s + self.output_noise(round, kind, s.shape)
        else:
            if D is None or x is None:
                raise ValueError("D and x are required for form='paper'")
            D = np.asarray(D, dtype=float)
            x = np.asarray(x, dtype=float)
            if D.ndim != 2 or x.ndim not in (1, 2) or x.shape[0] != D.shape[1]:
                raise ValueError(f"need D of shape (N, d) and x of shape (d,) or (d, K); "
                                 f"got D {D.shape}, x {x.shape}")
            xi = self.parameter_noise(round, kind, D, None if x.ndim == 1 else x.shape[1])
            released = D @ (x + xi)
        return released

    def dp_event(self, sensitivity: float) -> dp_accounting.DpEvent:
        """What one release is: Gaussian at z = σ/C ("output"), or not private ("paper")."""
        if self.form == "paper":
            return dpa().NonPrivateDpEvent()
        return dpa().GaussianDpEvent(self.sigma / float(sensitivity))
