"""A party's block model: what maps its columns D_m to its share f_m(D_m) of the score. No Flower imports.

ADMM sharing needs only s = sum_m f_m(D_m) at the central node; a party's x-update is a local
solve ``min_theta lam R(theta) + (rho/2) ||f_m(D_m; theta) - v||^2`` whatever f_m is. This module
is the extension point (docs/party-models.md): a kind in :data:`KINDS`, its settings as documented
node-config keys (:data:`SETTINGS`), read by :func:`block_from_config` from a party's node config
(the run config may suggest a default; the node config wins) or by the estimator's
``party_model`` argument. :data:`SETTINGS` and the base :class:`PartyBlock` live in
:mod:`flower_vfl.core.block_base` (which the MLP block subclasses too) and are re-exported here.

Kinds
-----
``linear``
    today's block: f_m = D_m x_m (the map is the identity, the very same array: trajectories stay
    bitwise).
``rff``, ``spline``, ``bins``
    data-independent feature maps (random Fourier features by scikit-learn's ``RBFSampler``, a
    B-spline basis per column by ``SplineTransformer`` on fixed knots, one-hot bins on fixed edges),
    by default beside the party's own columns (``party-model-linear``), every row scaled to unit
    norm. The block is linear in its parameters: the party maps its columns once, then runs the
    linear block's x-update, release, DP calibration and accounting unchanged on the mapped rows.
    The map is rebuilt from its settings and the party's column count alone, so a saved model holds
    no row.
``nystroem``
    a kernel map fitted on the party's rows (scikit-learn's ``Nystroem``: its landmarks are rows of
    D_m). Non-private parties only: refused for a private party by name, since its saved model would
    hold rows.
``mlp``
    a neural network per party (torch, the ``opacus`` extra): :mod:`flower_vfl.core.blocks_mlp`. Refused
    for a private party (no accountant covers its training here), and by name with the extra to
    install when torch is missing.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from flower_vfl.core.block_base import SETTINGS, PartyBlock, Setting
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.errors import UserError

__all__ = ["BlockError", "KINDS", "SETTINGS", "PartyBlock", "LinearBlock", "FeatureMapBlock", "block_from_config",
           "resolve_party_models", "map_blocks", "block_scores", "MODEL_KEY"]

#: the node-config / run-config key naming a party's block kind
MODEL_KEY = "party-model"


class BlockError(UserError, ValueError):
    """A party block model the party refuses: names the kind, the key or party and the fix."""


#: kind -> (data-independent, which settings it reads, what it is)
KINDS = {
    "linear": (True, "f_m = D_m x_m (the default)"),
    "rff": (True, "random Fourier features (RBFSampler) beside the columns, rows unit norm"),
    "spline": (True, "B-splines per column on fixed knots (SplineTransformer) beside the columns, rows unit norm"),
    "bins": (True, "one-hot bins per column on fixed edges beside the columns, rows unit norm"),
    "nystroem": (False, "Nystroem kernel map fitted on the party's rows (non-private parties only)"),
    "mlp": (True, "a neural network per party (torch: pip install 'flower-vfl[opacus]')"),
}


def _convert(s: Setting, value, where: str):
    try:
        if s.type is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                out = low in ("true", "1", "yes")
            else:
                out = bool(value)
        elif s.type is int:
            if isinstance(value, float) and value != int(value):
                raise ValueError(value)
            out = int(value)
        else:
            out = float(value)
            if not np.isfinite(out):
                raise ValueError(value)
    except (TypeError, ValueError):
        raise BlockError(f"{where} key {s.name!r}={value!r} is refused: expected a {s.type.__name__} "
                         f"({s.help})") from None
    if (s.lo is not None and out < s.lo) or (s.hi is not None and out > s.hi):
        raise BlockError(f"{where} key {s.name!r}={value!r} is out of range [{s.lo}, {s.hi}] ({s.help})")
    return out


class LinearBlock(PartyBlock):
    """Today's block: the identity map (the same array object: nothing is copied)."""


class FeatureMapBlock(PartyBlock):
    """A feature map of the party's columns, linear in its parameters (docs/party-models.md)."""

    unit_rows = True

    def __init__(self, kind, settings=None):
        super().__init__(settings)
        self.kind = kind
        self.data_independent = KINDS[kind][0]
        self.map = None

    def _get(self, key):
        return self.settings.get(key, SETTINGS[key].default)

    def _gamma(self, d):
        g = float(self._get("party-model-gamma"))
        return g if g > 0 else 1.0 / (2.0 * max(d, 1))

    def _edges(self, d):
        r, n = float(self._get("party-model-range")), int(self._get("party-model-knots"))
        return np.linspace(-r, r, n)

    def fit(self, D):
        super().fit(D)
        d = self.d_in
        if self.kind == "rff":
            from sklearn.kernel_approximation import RBFSampler
            # RBFSampler.fit reads only the column count of its input (gamma given): data-independent
            self.map = RBFSampler(gamma=self._gamma(d), n_components=int(self._get("party-model-features")),
                                  random_state=int(self._get("party-model-seed"))).fit(np.zeros((2, d)))
        elif self.kind == "spline":
            from sklearn.preprocessing import SplineTransformer
            knots = np.tile(self._edges(d)[:, None], (1, d))
            self.map = SplineTransformer(knots=knots, degree=int(self._get("party-model-degree")),
                                         extrapolation="constant", sparse_output=True).fit(np.zeros((2, d)))
        elif self.kind == "bins":
            self.map = self._edges(d)
        elif self.kind == "nystroem":
            from sklearn.kernel_approximation import Nystroem
            n = min(int(self._get("party-model-features")), D.shape[0])
            self.map = Nystroem(gamma=self._gamma(d), n_components=n,
                                random_state=int(self._get("party-model-seed"))).fit(D)
        return self

    def _dense(self, D):
        return D.toarray() if sp.issparse(D) else np.asarray(D, dtype=float)

    def features(self, D):
        if self.map is None:
            raise BlockError(f"party-model={self.kind!r}: the map is not fitted (call fit first)")
        if D.shape[1] != self.d_in:
            raise BlockError(f"party-model={self.kind!r}: rows have {D.shape[1]} columns, the map was built for "
                             f"{self.d_in}; give the party's columns in the training order")
        if self.kind == "rff":
            Z = self.map.transform(D)
        elif self.kind == "spline":
            r = float(self._get("party-model-range"))
            Z = self.map.transform(np.clip(self._dense(D), -r, r)).tocsr()
        elif self.kind == "bins":
            Z = _one_hot_bins(self._dense(D), self.map)
        else:
            Z = self.map.transform(D)
        Z = normalize_rows(Z)        # the mapped part of every row: unit norm
        if bool(self._get("party-model-linear")):
            # a dense map (rff, nystroem) stays dense: its Gram is one BLAS product, not a sparse one
            Z = sp.hstack([sp.csr_matrix(D), Z], format="csr") if sp.issparse(Z) \
                else np.hstack([self._dense(D), Z])
        return Z

    def to_meta(self) -> dict:
        if not self.data_independent:
            raise BlockError(f"party-model={self.kind!r} is fitted on the party's rows (its landmarks are rows): "
                             "it is not written to a model file; use a data-independent kind (rff, spline, bins)")
        return super().to_meta()


def _one_hot_bins(X, edges):
    """One column per (column, bin), bins on the fixed ``edges`` (inner edges split; values outside
    the outer ones fall in the first/last bin): a CSR indicator matrix."""
    n, d = X.shape
    nb = len(edges) + 1
    idx = np.searchsorted(edges, X, side="right")               # 0 .. nb-1
    cols = (np.arange(d)[None, :] * nb + idx).ravel()
    rows = np.repeat(np.arange(n), d)
    return sp.csr_matrix((np.ones(n * d), (rows, cols)), shape=(n, d * nb))


def _settings_of(config: dict, kind: str, where: str) -> dict:
    out = {}
    for key, value in dict(config or {}).items():
        if not key.startswith(MODEL_KEY + "-"):
            continue
        s = SETTINGS.get(key)
        if s is None:
            raise BlockError(f"{where} key {key!r} is unknown; the party-model settings are "
                             f"{', '.join(SETTINGS)} (docs/party-models.md)")
        if kind not in s.kinds:      # never silently ignored: the operator meant another kind
            raise BlockError(f"{where} key {key!r}={value!r} applies to {MODEL_KEY} "
                             f"{' / '.join(repr(k) for k in s.kinds)} only, and this party's {MODEL_KEY} is {kind!r}; "
                             f"remove {key!r} or set {MODEL_KEY} to one of those (docs/party-models.md)")
        out[key] = _convert(s, value, where)
    return out


def block_from_config(config, private: bool = False, party=None, where: str = "node config") -> PartyBlock:
    """The party's block model from config keys (``party-model`` and its ``party-model-*``
    settings). Raises :class:`BlockError` naming the kind/key and the fix: an unknown kind, a
    data-dependent map for a private party, an MLP for a private party, torch missing for 'mlp'."""
    config = dict(config or {})
    kind = str(config.get(MODEL_KEY, "linear") or "linear").strip().lower()
    who = f"party {party}" if party is not None else "this party"
    if kind not in KINDS:
        raise BlockError(f"{who}: {where} key {MODEL_KEY!r}={kind!r} is unknown; use one of "
                         f"{', '.join(repr(k) for k in KINDS)} (docs/party-models.md)")
    settings = _settings_of(config, kind, where)
    if private and not KINDS[kind][0]:
        raise BlockError(f"{who} is private and {MODEL_KEY}={kind!r} is refused: its map is fitted on the party's "
                         "rows (Nystroem landmarks are rows of the block), so its saved model and every release would "
                         "carry rows that no privacy calibration covers; use a data-independent map ('rff', 'spline' "
                         "or 'bins') or 'linear'")
    if kind == "mlp":
        if private:
            raise BlockError(f"{who} is private and {MODEL_KEY}='mlp' is refused: no accountant here covers a "
                             "network's training (its releases would carry privacy loss without an ε); use "
                             "'linear', 'rff', 'spline' or 'bins' for a private party, or run it without dp")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BlockError(f"{who}: {MODEL_KEY}='mlp' needs torch, which is not installed here; install the "
                             "extra: pip install 'flower-vfl[opacus]' (or use 'linear', 'rff', 'spline' or "
                             "'bins')") from None
        from flower_vfl.core.blocks_mlp import MLPBlock
        return MLPBlock({**{k: s.default for k, s in SETTINGS.items() if "mlp" in s.kinds}, **settings})
    if kind == "linear":
        return LinearBlock(settings)
    return FeatureMapBlock(kind, settings)


def block_from_meta(meta: dict) -> PartyBlock:
    """A block from :meth:`PartyBlock.to_meta` (the map rebuilt from its settings and column count)."""
    block = block_from_config({MODEL_KEY: meta["kind"], **meta.get("settings", {})}, where="model file")
    if meta.get("d_in") is not None:
        block.fit(np.zeros((2, int(meta["d_in"]))))
    if meta.get("n_out") is not None:          # a network's outputs (K for multinomial)
        block.n_out = int(meta["n_out"])
    return block


def resolve_party_models(party_model, n_parties: int, private=None, owner: str = "VerticalADMM"):
    """The estimator's ``party_model`` (None / a kind / a dict of config keys, or one of those per
    party as a list) as one :class:`PartyBlock` per party."""
    private = list(private) if private is not None else [False] * n_parties
    if party_model is None or isinstance(party_model, (str, dict)):
        entries = [party_model] * n_parties
    else:
        entries = list(party_model)
        if len(entries) != n_parties:
            raise BlockError(f"{owner}(party_model=...) has {len(entries)} entries but there are {n_parties} "
                             "blocks: give one kind (or dict of party-model keys) per party, or one for all")
    out = []
    for m, (e, pr) in enumerate(zip(entries, private)):
        if not isinstance(e, (str, dict)) and e is not None:
            raise BlockError(f"{owner}(party_model[{m}]={e!r}) is refused: expected a kind "
                             f"({', '.join(KINDS)}) or a dict of party-model keys")
        config = {MODEL_KEY: "linear"} if e is None else {MODEL_KEY: e} if isinstance(e, str) else dict(e)
        out.append(block_from_config(config, private=pr, party=m, where=f"{owner}(party_model[{m}])"))
    return out


def map_blocks(models, blocks):
    """Each party's mapped block (fits each map on its block first); a linear party's block is
    returned as is (the same object)."""
    return [m.fit_features(D) for m, D in zip(models, blocks)]


def block_scores(models, blocks, coefs):
    """Each party's score contribution f_m(D_m; x_m) from its block model (``models`` None: linear),
    summed, ``blocks`` already through each model's map (:meth:`PartyBlock.features`: a network's is
    the identity); None when every model is linear in its parameters (the caller's linear scoring
    applies)."""
    if not models or not any(getattr(m, "nonlinear", False) for m in models):
        return None
    return sum(m.predict(D, x) if getattr(m, "nonlinear", False) else np.asarray(D @ np.asarray(x), dtype=float)
               for m, D, x in zip(models, blocks, coefs))
