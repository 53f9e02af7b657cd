"""The settings of the vertical ADMM central node, one object built and checked from the schema.

:class:`StrategyConfig` holds what :class:`~flower_vfl.strategies.vertical_admm.VerticalADMMStrategy`
used to take as 26 separate arguments; every field the parameter table declares
(:data:`flower_vfl.config.schema.PARAMS`: the run config's types, ranges and defaults) is checked
when the object is made, so a bad value is refused before any data is read or any message is sent,
with an error naming the argument, the value, the accepted range and the fix.

    config = StrategyConfig(num_parties=3, max_rounds=30, tol=1e-6)
    strategy = VerticalADMMStrategy(y_train, y_test, config)
    # or, as before, the same names as keywords:
    strategy = VerticalADMMStrategy(y_train, y_test, num_parties=3, max_rounds=30, tol=1e-6)

:meth:`StrategyConfig.from_run_config` builds it from a checked run config (the ServerApp's).
:class:`MomentConfig` is the same for the moment route's label owner
(:class:`~flower_vfl.strategies.moment.MomentStrategy`); :func:`build_config` is what every central
node's config does with the former keyword (and, for DP-IADMM, positional) arguments.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flower_vfl.config.schema import SCHEMA, ParamError, check_params
from flower_vfl.core.rounds import DEFAULT_TOL_ABS

__all__ = ["StrategyConfig", "MomentConfig", "build_config"]


def build_config(cls, config=None, settings=None, args=()):
    """The config of type ``cls`` (a dataclass with ``OWNER``, the strategy its refusals name, and
    ``EXAMPLE``): ``config`` (or the defaults) with ``settings`` (the strategy's former keyword
    arguments) over it. An unknown name is refused naming the closest field. A class with
    ``POSITIONAL`` (field names) also takes the former positional arguments: ``config`` and
    ``args`` are then those values, in that order."""
    settings = dict(settings or {})
    names = [f.name for f in dataclasses.fields(cls)]
    for name in settings:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            raise ParamError(f"{cls.OWNER} got an unknown setting {name!r}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; the settings are the "
                             f"fields of {cls.__name__}: {', '.join(names)}")
    positional = getattr(cls, "POSITIONAL", ())
    if isinstance(config, cls) and not args:
        return dataclasses.replace(config, **settings) if settings else config
    if config is None and not args:
        return cls(**settings)
    if not positional or isinstance(config, cls):
        raise ParamError(f"{cls.OWNER}(config={config!r}) is refused: expected a {cls.__name__} "
                         f"({cls.__module__}) or None; pass e.g. {cls.EXAMPLE}")
    values = (config, *args)
    if len(values) > len(positional):
        raise ParamError(f"{cls.OWNER} takes at most {len(positional)} settings by position "
                         f"({', '.join(positional)}) but got {len(values)}; pass the others by name or "
                         f"in a {cls.__name__}, e.g. {cls.EXAMPLE}")
    for name in positional[:len(values)]:
        if name in settings:
            raise ParamError(f"{cls.OWNER} got the setting {name!r} both by position and by name; give it once")
    return cls(**dict(zip(positional, values)), **settings)


def _d(key):
    """The schema's default of run-config ``key``: the strategy's default is the run config's."""
    return SCHEMA[key].default


@dataclass(frozen=True)
class StrategyConfig:
    """Settings of the central node (label owner) of vertical ADMM sharing.

    Parameters
    ----------
    num_parties : int, default=2
    loss : str or Loss, default='logistic'
    rho : float, 'auto' or 0, default='auto'
        'auto' / 0: :func:`~flower_vfl.core.schedule.default_rho`.
    alpha : float in (0, 2), default=1.0
        Over-relaxation.
    variant : {'sharing', 'sharing-fixed', 'paper'}, default='sharing'
        The engine's (:class:`~flower_vfl.estimator.engine.VerticalADMM`): 'sharing' raises theta from
        the releases' alignment in plain rounds, here only without secure aggregation, a
        checkpoint folder or a resume (theta 1/M there, as 'sharing-fixed').
    fit_intercept : bool, default=True
    max_rounds : int, default=50
        Rounds (with private parties: of the warm start); ``start(num_rounds=...)`` sets it.
    tol, tol_abs : float, default=0.0, 1e-9
        Boyd's residual stopping rule (tol=0 runs every round), as the engine's.
    adaptive_rho : bool, default=False
        Residual balancing (Boyd Sec. 3.4.1), as the engine's.
    eval_every : int, default=0
        Evaluate every k rounds (0: only after the last round).
    timeout : float > 0, default=600
        Seconds to wait for the parties' replies in each round (``round-timeout``).
    party_wait : float >= 0, default=120
        Seconds to wait for a missing party: at identify until every party has a node, and for
        a lost SuperNode to come back (a restarted node is re-identified). 0: do not wait.
    stragglers : {'wait', 'stale'}, default='wait'
        'stale': a party that misses a round counts with its last release (bounded staleness).
    max_staleness : int >= 1, default=5
        Most consecutive rounds a party's last release may stand in for it.
    state_dir : str or None, default=None
        Folder of the atomic per-round checkpoint (None: no checkpoint;
        :mod:`~flower_vfl.strategies.checkpointing`).
    resume : str or None, default=None
        A state folder of an earlier run to continue (bitwise the same iterates). Refused, before
        any round, when the checkpoint's run record differs from this run's (naming each setting)
        or a party comes back with other data; parties without state are re-synchronized first.
    party_keys : str, dict or None, default=None
        Party -> SHA-256 fingerprint of the SuperNode auth key allowed to serve it (a dict or
        the path of a JSON file); a node whose key and claimed party disagree is refused.
    acceleration : {'auto', 'anderson', 'spectral', 'anderson+spectral', 'none'}, default='auto'
        As the engine's (core/accel.py; run config ``acceleration``). Anderson is off with
        alpha != 1, private parties, stragglers='stale', or a penalty other than 'l2' / a
        constraint (pass the parties' ``penalty`` and ``constraint`` from the run config);
        'auto' also leaves it off when it would hold more than 128 MiB.
    penalty, constraint : the parties' penalty and constraint (only decide the acceleration).
    label_epsilon : float or None, default=None
        Label DP (loss='logistic'): randomized response on ``y_train`` once, in the strategy, and
        the forward-corrected loss; None, 0 or inf: labels not protected (``label-epsilon``).
    max_release : float > 0, default=1e6
        A party's release (s_m, test scores) with an entry beyond +-max_release is refused,
        naming the party and the value (run config ``max-release``).
    run_settings : dict or None, default=None
        The parties' run-config settings that define the run besides these (``lam``,
        ``x-solver``, ``dataset``): recorded in the checkpoint, compared at resume.
    wire_dtype : {'float64', 'float32'}, default='float64'
        The dtype the N-vectors travel in, both ways (run config ``wire-dtype``).
    secagg : bool, default=False
        Secure aggregation (run config ``secagg``; docs/secagg.md): the parties mask their
        releases and the central node decodes only their sum. Needs stragglers='wait', no
        resume, at least 2 parties in every phase; Anderson acceleration is turned off.
    """

    num_parties: int = _d("num-parties")
    loss: Any = _d("loss")
    rho: Any = "auto"
    alpha: float = _d("alpha")
    variant: str = _d("variant")
    fit_intercept: bool = _d("fit-intercept")
    max_rounds: int = _d("max-rounds")
    tol: float = _d("tol")
    tol_abs: float = DEFAULT_TOL_ABS
    adaptive_rho: bool = False
    eval_every: int = _d("eval-every")
    timeout: float = _d("round-timeout")
    party_wait: float = _d("party-wait")
    stragglers: str = _d("stragglers")
    max_staleness: int = _d("max-staleness")
    state_dir: str | None = None
    resume: str | None = None
    party_keys: Any = None
    acceleration: str = _d("acceleration")
    penalty: str = _d("penalty")
    constraint: Any = None
    label_epsilon: float | None = None
    max_release: float = _d("max-release")
    run_settings: dict | None = None
    wire_dtype: str = _d("wire-dtype")
    secagg: bool = _d("secagg")

    def __post_init__(self):
        checked = check_params("VerticalADMMStrategy", {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        for name, value in checked.items():          # typed as the table says (e.g. 600 -> 600.0)
            object.__setattr__(self, name, value)
        if self.secagg and self.stragglers == "stale":
            raise ParamError("secagg=true with stragglers='stale': a secure sum needs every party of the round (a "
                             "stale party's last release is not held); use stragglers='wait'")

    #: the strategy the refusals name, and the example they give
    OWNER, EXAMPLE = "VerticalADMMStrategy", "StrategyConfig(num_parties=3)"

    @classmethod
    def build(cls, config: "StrategyConfig | None" = None, **settings) -> "StrategyConfig":
        """``config`` (or the defaults) with ``settings`` (the former keyword arguments) over it;
        an unknown name is refused naming the closest field."""
        return build_config(cls, config, settings)

    @classmethod
    def from_run_config(cls, cfg: dict, **settings) -> "StrategyConfig":
        """From a run config checked by :func:`~flower_vfl.config.schema.parse_run_config`
        (``settings``: what the run config does not hold, e.g. ``party_keys`` as a dict)."""
        rho, out, state = float(cfg["rho"]), cfg["out-dir"], cfg["state-dir"]
        base = dict(num_parties=int(cfg["num-parties"]), loss=str(cfg["loss"]), rho=rho if rho > 0 else "auto",
                    alpha=float(cfg["alpha"]), fit_intercept=bool(cfg["fit-intercept"]),
                    max_rounds=int(cfg["max-rounds"]), tol=float(cfg["tol"]), eval_every=int(cfg["eval-every"]),
                    timeout=cfg["round-timeout"], party_wait=cfg["party-wait"], stragglers=cfg["stragglers"],
                    max_staleness=cfg["max-staleness"],
                    state_dir=state or (str(Path(out) / "state") if out else None),
                    resume=cfg["resume"] or None, party_keys=cfg["party-keys"] or None,
                    label_epsilon=float(cfg["label-epsilon"]) or None, max_release=float(cfg["max-release"]),
                    penalty=str(cfg["penalty"]), acceleration=str(cfg["acceleration"]),
                    variant=str(cfg["variant"]), secagg=bool(cfg["secagg"]), wire_dtype=str(cfg["wire-dtype"]),
                    run_settings={"lam": float(cfg["lam"]), "x-solver": str(cfg["x-solver"]),
                                  "dataset": "" if cfg["labels-path"] else str(cfg["dataset"])})
        return cls(**{**base, **settings})


@dataclass(frozen=True)
class MomentConfig:
    """Settings of the label owner of the moment route
    (:class:`~flower_vfl.strategies.moment.MomentStrategy`), checked by the parameter table
    (:data:`flower_vfl.config.schema.PARAMS`) when the object is made.

    Parameters
    ----------
    num_parties : int, default=2
    lam : float > 0, default=3e-4
        The L2 coefficient of the pool objective F (``lam``; 3e-4 is the in-process route's choice
        at epsilon = 1).
    rho : float, None or 'auto', default=None
        The ADMM penalty (``rho``; None, 'auto' or 0: :func:`~flower_vfl.core.moment_sharing.default_rho`).
    max_rounds : int, default=50
        ADMM rounds per fit (``max-rounds``).
    tol : float, default=0
        Stop a fit when max |s^{k+1} - s^k| over the parties' pool scores and |b^{k+1} - b^k| are
        below ``tol`` (``tol``; 0 runs every round).
    timeout, party_wait, party_keys, max_release :
        As :class:`StrategyConfig`'s (``round-timeout``, ``party-wait``, ``party-keys``, ``max-release``).
    """

    num_parties: int = _d("num-parties")
    lam: float = 3e-4
    rho: Any = None
    max_rounds: int = _d("max-rounds")
    tol: float = _d("tol")
    timeout: float = _d("round-timeout")
    party_wait: float = _d("party-wait")
    party_keys: Any = None
    max_release: float = _d("max-release")

    OWNER, EXAMPLE = "MomentStrategy", "MomentConfig(num_parties=3, lam=3e-4)"

    def __post_init__(self):
        checked = check_params(self.OWNER, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                            if f.name != "lam"})
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        lam = self.lam
        if isinstance(lam, bool) or not isinstance(lam, (int, float, np.integer, np.floating)) or not (
                np.isfinite(lam) and lam > 0):
            raise ParamError(f"{self.OWNER}(lam={lam!r}) is refused: the moment route needs a finite lam > 0 (the "
                             "pool objective must be bounded; run config key 'lam'); pass lam= such a value, e.g. "
                             "the default lam=0.0003 (the choice at epsilon = 1)")
        object.__setattr__(self, "lam", float(lam))

    @classmethod
    def build(cls, config: "MomentConfig | None" = None, **settings) -> "MomentConfig":
        """``config`` (or the defaults) with ``settings`` (the former keyword arguments) over it."""
        return build_config(cls, config, settings)

    @classmethod
    def from_run_config(cls, cfg: dict, **settings) -> "MomentConfig":
        """From a run config checked by :func:`~flower_vfl.config.schema.parse_run_config`."""
        base = dict(num_parties=int(cfg["num-parties"]), lam=float(cfg["lam"]), rho=float(cfg["rho"]) or None,
                    max_rounds=int(cfg["max-rounds"]), tol=float(cfg["tol"]), timeout=float(cfg["round-timeout"]),
                    party_wait=float(cfg["party-wait"]), party_keys=cfg["party-keys"] or None,
                    max_release=float(cfg["max-release"]))
        return cls(**{**base, **settings})
