"""What a party accepts from the network: the trust boundary, in one file.

The central node may be curious or malicious: it may send any message, any round number,
any scalar, replay old rounds, start new runs and write any run-config key. Everything a
party reads from a message passes through :func:`parse_round` before it touches the party's
state or its budget; a message that fails is refused with an error naming the field, and
nothing is charged or changed. The party's own node config and disk are the only things it
trusts (its privacy settings: :func:`party_privacy_settings`).

No Flower imports: ``content`` is any mapping of records (Flower's ``RecordDict`` is one).
"""

from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["InvalidMessage", "Refused", "RoundInputs", "inputs_hash", "parse_count", "parse_flag", "parse_round",
           "parse_wire_dtype", "to_wire", "parse_field", "parse_scalar", "parse_vector", "parse_round_number",
           "parse_in_range", "parse_moment_round", "MomentRound", "MOMENT_LIMITS", "MAX_MOMENT_ROUND",
           "private_rho_range", "PRIVATE_RHO_N", "PROTOCOL_RANGES", "MAX_OUTPUTS",
           "WIRE_DTYPES", "WIRE_FIELD",
           "TARGET_FIELD", "TARGET_NORM_FIELD"]

#: the most score columns (classes K) a party builds an x-update for
MAX_OUTPUTS = 1000

#: scalars the protocol uses (docs/privacy.md, "Trust model"): rho > 0 finite; theta is the
#: sharing damping 1/M .. 1; alpha is Boyd's over-relaxation in (0, 2)
PROTOCOL_RANGES = {"rho": (0.0, math.inf), "theta": (0.0, 1.0), "alpha": (0.0, 2.0)}

#: a private party's default bounds on rho * N where its node config sets no min-rho / max-rho. The
#: loss is averaged over the N aligned rows, so its curvature, and every rho the protocol picks, is
#: of order 1/N (core/schedule.py: 0.025 c/N .. 3 c/N, residual balancing moves it by factors of 2);
#: a rho far outside buys no accuracy for the budget it spends (its sensitivity grows as
#: sqrt(rho / lam)), and one near 0 or the float range only breaks the calibration
PRIVATE_RHO_N = (1e-3, 1e3)

#: the dtypes N-vectors travel in (run config ``wire-dtype``), both ways: float64 (exact) or
#: float32 (half the bytes; each value rounded once, to 24 significant bits). What arrives is
#: upcast to float64 before any use; anything else is refused. The codec of both ends: the
#: central node's :func:`flower_vfl.strategies.exchange.wire_content` and a party's
#: :func:`parse_round` / ``PartyClient._reply``, both through :func:`to_wire`.
WIRE_DTYPES = ("float64", "float32")
#: the config field telling a party in which dtype to reply (absent: float64)
WIRE_FIELD = "wire_dtype"
#: a train request's one N-vector at alpha = 1 (``vectors['v']``, with ``config['q_norm']``): the
#: x-update target the central node forms from the party's last release
#: (:func:`flower_vfl.core.party.x_update_target`), instead of ``q`` and ``y``
TARGET_FIELD, TARGET_NORM_FIELD = "v", "q_norm"


class Refused(UserError, RuntimeError):
    """A request the party will not answer; ``code`` says why (sent back to the server)."""

    code = "refused"

    def __init__(self, message, field=None):
        super().__init__(message)
        self.field = field


class InvalidMessage(Refused, ValueError):
    """A malformed message: a field missing, of the wrong type or shape, or out of range."""

    code = "invalid"


@dataclass(frozen=True)
class RoundInputs:
    """A validated request: round number, scalars and (when present) q, y."""

    round: int
    rho: float
    alpha: float
    theta: float
    q: np.ndarray | None
    y: np.ndarray | None
    final_update: bool
    #: the dtype the party replies in (:data:`WIRE_DTYPES`)
    wire: str = "float64"
    #: the x-update target itself, sent instead of q and y at alpha = 1 (:data:`TARGET_FIELD`;
    #: the party clips it as it clips the target it forms), and ||q|| beside it
    v: np.ndarray | None = None
    q_norm: float | None = None


def _who(party) -> str:
    """'party 3' for a party index; a string (say 'agent 0') as given."""
    return party if isinstance(party, str) else f"party {party}"


def _field(record, key, where):
    try:
        return record[key]
    except (KeyError, TypeError):
        raise InvalidMessage(f"message field {where}[{key!r}] is missing", field=f"{where}.{key}") from None


def _scalar(cfg, key, lo, hi, party, *, open_hi=False):
    v = _field(cfg, key, "config")
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidMessage(f"{_who(party)}: config[{key!r}]={v!r} is not a number", field=f"config.{key}")
    v = float(v)
    ok = math.isfinite(v) and lo < v and (v < hi if open_hi else v <= hi)
    if not ok:
        raise InvalidMessage(f"{_who(party)}: config[{key!r}]={v!r} is outside the protocol's range "
                             f"({lo:g}, {hi:g}{')' if open_hi else ']'}; refused, nothing charged",
                             field=f"config.{key}")
    return v


#: the two readers above under public names, for the parties that parse their own fields with them
#: (the horizontal agent, flower_vfl/clients/dpiadmm.py; the vertical SGD party)
parse_field, parse_scalar = _field, _scalar


def _vector(vectors, key, n_rows, n_outputs, party):
    rec = _field(vectors, key, "vectors")
    try:
        a = rec.numpy() if hasattr(rec, "numpy") else np.asarray(rec)
    except Exception as exc:  # an Array that does not decode
        raise InvalidMessage(f"party {party}: vectors[{key!r}] does not decode: {exc}", field=f"vectors.{key}") from None
    if a.dtype not in (np.float64, np.float32):
        raise InvalidMessage(f"party {party}: vectors[{key!r}] has dtype {a.dtype}; expected float64 or float32 "
                             "(the wire dtypes); refused, nothing charged", field=f"vectors.{key}")
    want = (n_rows,) if n_outputs == 1 else (n_rows, n_outputs)
    if a.shape != want:
        raise InvalidMessage(f"party {party}: vectors[{key!r}] has shape {a.shape}; this party holds "
                             f"{n_rows} aligned rows, so the shape must be {want}", field=f"vectors.{key}")
    a = np.asarray(a, dtype=np.float64)
    if not np.isfinite(a).all():
        raise InvalidMessage(f"party {party}: vectors[{key!r}] holds {int((~np.isfinite(a)).sum())} NaN/inf "
                             "entries; refused, nothing charged", field=f"vectors.{key}")
    return a


def parse_wire_dtype(cfg, party) -> str:
    """``cfg['wire_dtype']``: the dtype this party's reply travels in (absent: float64); anything but
    one of :data:`WIRE_DTYPES` is refused, naming the key."""
    v = cfg.get(WIRE_FIELD, "float64") if hasattr(cfg, "get") else "float64"
    if not isinstance(v, str) or v not in WIRE_DTYPES:
        raise InvalidMessage(f"{_who(party)}: config[{WIRE_FIELD!r}]={v!r} is not a wire dtype; expected one of "
                             f"{', '.join(map(repr, WIRE_DTYPES))}; refused, nothing charged",
                             field=f"config.{WIRE_FIELD}")
    return v


def to_wire(a, wire: str = "float64") -> np.ndarray:
    """The float vector ``a`` as it travels: float64, or float32 (one rounding; values are
    computed, and a private party's noise added, in float64 before: the cast is post-processing)."""
    if wire not in WIRE_DTYPES:
        raise ValueError(f"wire dtype {wire!r}: expected one of {WIRE_DTYPES}")
    return np.asarray(a, dtype=np.float32 if wire == "float32" else np.float64)


def parse_flag(cfg, key, party) -> bool:
    """``cfg[key]`` as a flag: absent is False; anything but a bool is refused (a string "false"
    must not read as True)."""
    v = cfg.get(key, False) if hasattr(cfg, "get") else False
    if not isinstance(v, (bool, np.bool_)):
        raise InvalidMessage(f"{_who(party)}: config[{key!r}]={v!r} is not a boolean; send true or false",
                             field=f"config.{key}")
    return bool(v)


def parse_count(cfg, key, party, *, default: int | None, lo: int, hi: int, why: str = "") -> int:
    """``cfg[key]`` as an integer in lo..hi (``default`` when absent; None: required); refused otherwise, naming
    the key and the range (``why``: where the range comes from)."""
    if default is None:                                   # required
        v = _field(cfg, key, "config")
    else:
        v = cfg.get(key, default) if hasattr(cfg, "get") else default
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
        raise InvalidMessage(f"{_who(party)}: config[{key!r}]={v!r} must be an integer in {lo}..{hi}"
                             f"{why}; refused, nothing charged", field=f"config.{key}")
    return int(v)


def parse_vector(content, key, n, what, party, *, bound=None, name="") -> np.ndarray:
    """``content['vectors'][key]`` (an ArrayRecord of the message ``content``): a readable float vector
    of shape (n,) ("one value per <what>"), finite, within +-``bound`` (None: unbounded), as float64;
    ``name`` follows the key in the "missing" refusal. The one-release routes' target and the moment
    route's pool vector."""
    who = _who(party)
    vectors = content.array_records.get("vectors")
    if vectors is None or key not in vectors:
        raise InvalidMessage(f"{who}: message field vectors[{key!r}]{name} is missing", field=f"vectors.{key}")
    try:
        a = vectors[key].numpy()
    except Exception:
        raise InvalidMessage(f"{who}: vectors[{key!r}] is not a readable array", field=f"vectors.{key}") from None
    if a.dtype.kind != "f":
        raise InvalidMessage(f"{who}: vectors[{key!r}] has dtype {a.dtype}; expected float64", field=f"vectors.{key}")
    if a.shape != (n,):
        raise InvalidMessage(f"{who}: vectors[{key!r}] has shape {a.shape}; expected ({n},) (one value per "
                             f"{what})", field=f"vectors.{key}")
    if not np.all(np.isfinite(a)):
        raise InvalidMessage(f"{who}: vectors[{key!r}] holds NaN or inf values", field=f"vectors.{key}")
    if bound is not None and np.max(np.abs(a), initial=0.0) > bound:
        raise InvalidMessage(f"{who}: vectors[{key!r}] holds values beyond +-{bound:g}", field=f"vectors.{key}")
    return np.asarray(a, dtype=np.float64)


def parse_round_number(cfg, party, lo: int, hi: int, expected: str = "") -> int:
    """``cfg['round']`` of a one-release route's message: an integer lo..hi (``expected``: what the
    refusal says instead of "an integer lo..hi")."""
    rnd = None if cfg is None else cfg.get("round")
    if isinstance(rnd, bool) or not isinstance(rnd, int) or not lo <= rnd <= hi:
        raise InvalidMessage(f"{_who(party)}: config['round']={rnd!r}; expected {expected or f'an integer {lo}..{hi}'}",
                             field="config.round")
    return int(rnd)


def parse_in_range(cfg, key, lo, hi, party) -> float:
    """``cfg[key]``: a finite real number in [lo, hi] (inclusive: the party's own limits), as float."""
    v = None if cfg is None else cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(float(v)) and lo <= v <= hi):
        raise InvalidMessage(f"{_who(party)}: config[{key!r}]={v!r} is outside the range this party accepts "
                             f"[{lo:g}, {hi:g}]; refused", field=f"config.{key}")
    return float(v)


#: the moment route's ranges of what a party accepts in its ADMM rounds (inclusive; rho is narrowed by
#: the node config's min-rho / max-rho). None of them protects a training row (every reply is
#: post-processing of g~ and of the pool): they keep the arithmetic finite and the model meaningful
MOMENT_LIMITS = {"rho": (1e-12, 1e6), "lam": (1e-12, 1e3), "c": 1e6}
#: the largest ADMM round number a moment route's request may carry
MAX_MOMENT_ROUND = 100_000


@dataclass(frozen=True)
class MomentRound:
    """A validated moment-route round (``train.moment`` / ``evaluate.moment``)."""

    round: int
    fit: int
    rho: float
    lam: float
    kappa: float
    c: np.ndarray


def parse_moment_round(content, party, *, c_v: float, pool_sizes, rho_range=None) -> MomentRound:
    """round 1..MAX_MOMENT_ROUND, fit 0 or 1, rho in MOMENT_LIMITS and the node config's ``rho_range``
    (min-rho, max-rho; either None), lam in MOMENT_LIMITS, kappa in (c_v, 2 c_v] (kappa = c_v / max(pi,
    1 - pi), ``c_v`` the party's clip), and ``vectors['c']``: one finite value per pool row
    (``pool_sizes[fit]``), each within +-MOMENT_LIMITS['c']."""
    who = _who(party)
    cfg = content.config_records.get("config")
    rnd = parse_round_number(cfg, party, 1, MAX_MOMENT_ROUND)
    fit = cfg.get("fit")
    if isinstance(fit, bool) or fit not in (0, 1):
        raise InvalidMessage(f"{who}: config['fit']={fit!r}; expected 0 or 1 (which half of the held-out rows "
                             "is the pool)", field="config.fit")
    lo, hi = MOMENT_LIMITS["rho"]
    if rho_range is not None:
        lo = lo if rho_range[0] is None else max(lo, rho_range[0])
        hi = hi if rho_range[1] is None else min(hi, rho_range[1])
    rho = parse_in_range(cfg, "rho", lo, hi, party)
    lam = parse_in_range(cfg, "lam", *MOMENT_LIMITS["lam"], party)
    c_v = float(c_v)
    kappa = cfg.get("kappa")
    if isinstance(kappa, bool) or not isinstance(kappa, numbers.Real) or not (
            math.isfinite(float(kappa)) and c_v < kappa <= 2 * c_v):
        raise InvalidMessage(f"{who}: config['kappa']={kappa!r}; expected c_v / max(pi, 1 - pi), in "
                             f"({c_v:g}, {2 * c_v:g}] for this party's clip c_v={c_v:g}", field="config.kappa")
    c = parse_vector(content, "c", int(pool_sizes[int(fit)]), "pool row", party, bound=MOMENT_LIMITS["c"])
    return MomentRound(int(rnd), int(fit), rho, lam, float(kappa), c)


def private_rho_range(n_rows: int, rho_range=None) -> tuple:
    """A private party's accepted (min, max) rho: its node config's ``min-rho`` / ``max-rho``
    (``rho_range``, either may be None) and, for an end it leaves unset, the default
    :data:`PRIVATE_RHO_N` / N from its own row count; a third element says where the bounds come
    from (:func:`parse_round`'s refusal names it)."""
    lo, hi = (rho_range or (None, None))[:2]
    if lo is not None and hi is not None:
        return lo, hi
    n = max(int(n_rows), 1)
    why = (f"its node config's min-rho / max-rho where set, else a private party's default "
           f"{PRIVATE_RHO_N[0]:g}/N .. {PRIVATE_RHO_N[1]:g}/N for its N={n} rows: a rho far from the loss's "
           "scale 1/N buys no accuracy for the budget it spends; set min-rho / max-rho in its node config to "
           "accept another")
    return (PRIVATE_RHO_N[0] / n if lo is None else lo, PRIVATE_RHO_N[1] / n if hi is None else hi, why)


def parse_round(content, *, n_rows: int, party, needs_vectors: bool, n_outputs: int = 1,
                rho_range=None, max_round: int = 10**9, accept_target: bool = False) -> RoundInputs:
    """Validate a train/evaluate request; raise :class:`InvalidMessage` naming the field.

    ``rho_range`` = (min, max), inclusive, from the party's node config (``min-rho``/``max-rho``;
    None for either: no bound beyond the protocol's), narrows rho; a third element, if any, says
    where the bounds come from (:func:`private_rho_range`). ``accept_target``: the vectors may be
    the x-update target alone (:data:`TARGET_FIELD`, a train request at alpha = 1) instead of q, y.
    """
    cfg = _field(content, "config", "message")
    rnd = _field(cfg, "round", "config")
    if isinstance(rnd, bool) or not isinstance(rnd, numbers.Integral) or not 0 <= int(rnd) <= max_round:
        raise InvalidMessage(f"party {party}: config['round']={rnd!r} must be an integer in 0..{max_round}",
                             field="config.round")
    rho = _scalar(cfg, "rho", *PROTOCOL_RANGES["rho"], party)
    lo, hi = rho_range[:2] if rho_range is not None else (None, None)
    if (lo is not None and rho < lo) or (hi is not None and rho > hi):
        why = rho_range[2] if len(rho_range) > 2 else "its node config's min-rho / max-rho"
        raise InvalidMessage(f"party {party}: config['rho']={rho!r} is outside the range this party accepts "
                             f"[{'0' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}] ({why}); "
                             "refused, nothing charged", field="config.rho")
    theta = _scalar(cfg, "theta", *PROTOCOL_RANGES["theta"], party)
    alpha = _scalar(cfg, "alpha", *PROTOCOL_RANGES["alpha"], party, open_hi=True)
    final = parse_flag(cfg, "final_update", party)
    wire = parse_wire_dtype(cfg, party)
    q = y = v = q_norm = None
    if needs_vectors:
        vectors = _field(content, "vectors", "message")
        if accept_target and TARGET_FIELD in vectors and "q" not in vectors and "y" not in vectors:
            # the target alone (alpha = 1 only: a relaxed x-update needs q and the party's z_loc)
            if alpha != 1.0:
                raise InvalidMessage(f"party {party}: vectors[{TARGET_FIELD!r}] (the x-update target alone) "
                                     f"with config['alpha']={alpha!r}; the target is sent alone at alpha = 1 only, "
                                     "else q and y; refused, nothing charged", field=f"vectors.{TARGET_FIELD}")
            v = _vector(vectors, TARGET_FIELD, n_rows, n_outputs, party)
            q_norm = _scalar(cfg, TARGET_NORM_FIELD, -math.inf, math.inf, party)
            if q_norm < 0.0:
                raise InvalidMessage(f"party {party}: config[{TARGET_NORM_FIELD!r}]={q_norm!r} is a norm; it must be "
                                     ">= 0; refused, nothing charged", field=f"config.{TARGET_NORM_FIELD}")
        else:
            q = _vector(vectors, "q", n_rows, n_outputs, party)
            y = _vector(vectors, "y", n_rows, n_outputs, party)
    return RoundInputs(int(rnd), rho, alpha, theta, q, y, final, wire, v, q_norm)


def inputs_hash(run, kind: str, inputs: RoundInputs) -> str:
    """SHA-256 of everything a release depends on that came from the server."""
    h = hashlib.sha256()
    h.update(f"{run}|{kind}|{inputs.round}|{inputs.rho!r}|{inputs.alpha!r}|{inputs.theta!r}|"
             f"{inputs.final_update}".encode())
    if inputs.q_norm is not None:
        h.update(f"|q_norm={inputs.q_norm!r}".encode())
    for a in (inputs.q, inputs.y, inputs.v):
        if a is not None:
            a = np.ascontiguousarray(a, dtype=np.float64)
            h.update(f"{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()
