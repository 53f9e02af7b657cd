"""The base of every party block model: :class:`PartyBlock` and the kind-specific settings it reads
(:data:`SETTINGS`). No Flower imports.

Its own module so that :mod:`flower_vfl.core.blocks` (the kinds, built from config) and
:mod:`flower_vfl.core.blocks_mlp` (the network block, imported by ``blocks`` only when a party asks
for one) both import it without importing each other: ``blocks`` re-exports both names, so
``from flower_vfl.core.blocks import PartyBlock, SETTINGS`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Setting", "SETTINGS", "PartyBlock"]


@dataclass(frozen=True)
class Setting:
    """One kind-specific key: its type, default, range and help (``kinds``: the kinds reading it)."""

    name: str
    type: type
    default: object
    kinds: tuple
    help: str
    lo: float | None = None
    hi: float | None = None


#: every kind-specific key (node config, or the run config as a default); config/schema.py declares
#: the same keys (tests check they agree)
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("party-model-features", int, 512, ("rff", "nystroem"), "number of random features (rff) or landmarks "
            "(nystroem)", lo=1, hi=100_000),
    Setting("party-model-gamma", float, 0.0, ("rff", "nystroem"), "RBF kernel width gamma; 0 = 1/(2 d_m), d_m the "
            "party's column count (data-independent: columns assumed standardized)", lo=0.0),
    Setting("party-model-seed", int, 0, ("rff", "nystroem", "mlp"), "seed of the random map or of the network's "
            "initialization and minibatches", lo=0),
    Setting("party-model-knots", int, 6, ("spline", "bins"), "knots (spline) or bin edges (bins) per column, "
            "evenly spaced on [-range, range]", lo=2, hi=1000),
    Setting("party-model-degree", int, 3, ("spline",), "spline degree", lo=1, hi=5),
    Setting("party-model-range", float, 3.0, ("spline", "bins"), "knots/edges on [-range, range] (fixed, not "
            "fitted: columns assumed standardized; values outside are clipped)", lo=0.0),
    Setting("party-model-linear", bool, True, ("rff", "spline", "bins", "nystroem"), "keep the party's own "
            "columns beside the mapped ones"),
    Setting("party-model-width", int, 256, ("mlp",), "hidden units per layer", lo=1, hi=100_000),
    Setting("party-model-layers", int, 1, ("mlp",), "hidden layers", lo=1, hi=16),
    Setting("party-model-epochs", int, 1, ("mlp",), "local epochs toward v per round (warm-started)", lo=1, hi=1000),
    Setting("party-model-lr", float, 1e-3, ("mlp",), "Adam learning rate of the local epochs (of round 1)", lo=0.0),
    Setting("party-model-lr-decay", float, 0.97, ("mlp",), "the learning rate of round k is lr * lr-decay^(k-1) "
            "(1 = constant)", lo=0.0, hi=1.0),
    Setting("party-model-batch", int, 256, ("mlp",), "minibatch size of the local epochs", lo=1),
)}


class PartyBlock:
    """A party's block model. Linear in its parameters (feature maps): ``features(D)`` maps rows
    once, the x-update, release and prediction are the linear block's on the mapped rows.

    ``fit(D)`` fixes the map for the party's column count (and, for a data-dependent kind, its
    rows); ``features(D)`` maps any rows of the same columns; ``predict(D, x)`` is
    ``features(D) @ x``; ``to_meta()`` / :func:`~flower_vfl.core.blocks.block_from_meta` save and
    rebuild it (no rows for a data-independent kind). The release's sensitivity: a private party
    normalizes its whole (mapped) row to unit norm, as it does for its linear block, so the linear
    block's calibration and accounting hold unchanged (``unit_rows``: the mapped part of each row
    already has unit norm)."""

    kind = "linear"
    data_independent = True
    #: the mapped part of every row has unit L2 norm
    unit_rows = False

    def __init__(self, settings=None):
        self.settings = dict(settings or {})
        self.d_in = None

    def fit(self, D):
        self.d_in = int(D.shape[1])
        return self

    def features(self, D):
        return D

    def fit_features(self, D):
        return self.fit(D).features(D)

    def predict(self, D, x):
        return np.asarray(self.features(D) @ np.asarray(x), dtype=float)

    def to_meta(self) -> dict:
        return {"kind": self.kind, "settings": dict(self.settings), "d_in": self.d_in}

    def describe(self) -> str:
        """The kind and every setting it reads (defaults filled), e.g. ``rff (features=64, gamma=0.0,
        linear=True, seed=3)``: what a party tells the central node at identify (no data)."""
        full = {k: self.settings.get(k, s.default) for k, s in SETTINGS.items() if self.kind in s.kinds}
        shown = ", ".join(f"{k.replace('party-model-', '')}={v}" for k, v in sorted(full.items()))
        return self.kind + (f" ({shown})" if shown else "")
