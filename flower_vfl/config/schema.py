"""One schema for every configuration key (run config, node config, command line).

Each key has a type, a default, a range or a set of allowed values, a meaning and a *scope*:

``run``
    only the run config (``flwr run --run-config``, the CLI) may set it; a SuperNode's node
    config that sets it is refused (a node overriding ``num-parties`` would train on the
    wrong columns).
``node``
    only a SuperNode's node config sets it (``partition-id``: which party the node serves).
``node-first``
    the run config may ask, a party's node config wins: ``dp`` and ``dp-parties`` (a run-config
    request can only make a party *more* private).
``party``
    a private party's own settings: read **only** from its node config (its budget is its own;
    docs/privacy.md, "Trust model"). The run config may carry them for ``flwr run``'s
    declaration check, but a party never reads them there; ``flower-vfl fit`` and ``simulate``
    hand their ``--dp-*`` flags to the simulated parties as node configs.
``both``
    read from whichever config the reader owns: ``data-dir`` and ``state-dir`` are the label
    owner's folders in the run config and a party's own folders in its node config.
``hz-run`` / ``hz-node``
    the horizontal app's (:mod:`flower_vfl.apps.horizontal`) run config and an agent's node
    config; the vertical app refuses them. The horizontal app also reads ``out-dir`` and
    ``data-dir`` (run), ``partition-id``, ``data-dir``, ``state-dir``, ``dp-seed`` and
    ``dp-delta`` (node): :data:`HORIZONTAL_RUN_KEYS`, :data:`HORIZONTAL_NODE_KEYS`.

A ``party`` key is not a run-config key: a run config that sets one is refused before any
round (the party would ignore it). Keys of earlier versions that named a party's files from the
run config (:data:`RETIRED`) are refused with the key to use instead.

Values are parsed once, at start (ServerApp start, the party's identify, the CLI), so a bad
value stops the run before any round with an error naming the key, the bad value and what is
allowed. No Flower imports.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from flower_vfl.errors import UserError
from flower_vfl.core.accel import ACCELERATIONS
from flower_vfl.core.blocks import KINDS as PARTY_MODELS, SETTINGS as PARTY_MODEL_SETTINGS
from flower_vfl.core.losses import LOSSES
from flower_vfl.core.xsolve import METHODS as X_SOLVERS
from flower_vfl.core.penalties import PENALTIES
from flower_vfl.core.rounds import DEFAULT_TOL_ABS, VARIANTS
from flower_vfl.io.data import DATASETS

__all__ = ["ConfigError", "Key", "SCHEMA", "RETIRED", "HORIZONTAL_RUN_KEYS", "HORIZONTAL_NODE_KEYS",
           "run_defaults", "check_value", "parse_run_config", "parse_node_config", "parse_horizontal_run_config",
           "parse_agent_node_config", "setting", "markdown_table", "ParamError", "Param", "PARAMS",
           "DPIADMM_PARAMS", "SGD_PARAMS",
           "PRIVACY_FIELDS", "check_param", "check_params", "check_privacy", "EnvVar", "ENVIRONMENT"]

SCOPES = ("run", "node", "node-first", "party", "both", "hz-run", "hz-node")
#: the horizontal DP-IADMM variants (flower_vfl.horizontal.admm.VARIANTS; tests check they agree)
HZ_VARIANTS = ("objp", "objt", "outp")
#: dp-accountant values (flower_vfl.privacy.accounting.METHODS; rdp/prv need the opacus extra)
ACCOUNTANTS = ("exact", "pld", "rdp", "prv", "paper")


class ConfigError(UserError, ValueError):
    """A configuration value that the schema refuses (names the key and what is allowed)."""


@dataclass(frozen=True)
class Key:
    """One configuration key: ``type`` is bool, int, float or str; ``lo``/``hi`` bound
    numbers (``lo_open``/``hi_open`` make a bound strict); ``choices`` lists allowed strings."""

    name: str
    type: type
    default: Any
    scope: str
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple | None = None

    def allowed(self) -> str:
        """What the key accepts, in words (used in every error message)."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return "a string"
        if self.type is object:
            return "see its module"
        kind = "an integer" if self.type is int else "a finite number"
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        return kind + (" " + " and ".join(parts) if parts else "")


def _k(name, type_, default, scope, help, **kw):
    return name, Key(name, type_, default, scope, help, **kw)


SCHEMA: dict[str, Key] = dict([
    # --- the model and the protocol: the label owner's run config decides
    _k("dataset", str, "breast_cancer", "run", "bundled dataset (breast_cancer ships with scikit-learn)", choices=DATASETS),
    _k("num-parties", int, 2, "run", "number of column blocks / parties (one SuperNode each)", lo=1, hi=1000),
    _k("loss", str, "logistic", "run", "loss of the label owner", choices=tuple(LOSSES)),
    _k("penalty", str, "l2", "run", "the parties' regularizer", choices=tuple(PENALTIES)),
    _k("lam", float, 1e-4, "run", "regularization coefficient λ", lo=0.0),
    _k("rho", float, 0.0, "run", "ADMM penalty ρ; 0 = default 0.2·c/N (0.2·c/(8N) with l1/elasticnet, 3·c/N for the nonconvex sigmoid)",
       lo=0.0),
    _k("alpha", float, 1.0, "run", "over-relaxation (Boyd 3.4.3)", lo=0.0, hi=2.0, lo_open=True, hi_open=True),
    _k("fit-intercept", bool, True, "run", "the label owner fits an unpenalized intercept"),
    _k("acceleration", str, "auto", "run", "fewer rounds (core/accel.py): 'auto' = Anderson for L2 without a "
                                          "constraint while it holds <= 128 MiB, none otherwise; 'anderson', 'spectral' (adaptive ρ, "
                                          "Xu et al. 2017), 'anderson+spectral' or 'none'",
       choices=ACCELERATIONS),
    _k("variant", str, "sharing", "run", "the parties' Jacobi damping θ (docs/math.md, Variants): 'sharing' = 1/M, "
                                       "then from the alignment of the releases in plain L2 rounds (no secure aggregation, "
                                       "checkpoint or resume); 'sharing-fixed' = 1/M (Boyd 7.3); 'paper' = 1 (eq. 6)",
       choices=VARIANTS),
    _k("x-solver", str, "auto", "run", "the parties' x-update method (core/xsolve.py): 'auto' chooses by "
                                      "the block's shape", choices=X_SOLVERS),
    _k("max-rounds", int, 50, "run", "ADMM rounds", lo=1, hi=1_000_000),
    _k("tol", float, 0.0, "run", "relative residual tolerance (Boyd 3.3.1); 0 runs every round", lo=0.0),
    _k("eval-every", int, 0, "run", "evaluate every k rounds (0: only at the end)", lo=0),
    _k("label-epsilon", float, 0.0, "run", "label DP of the label owner (loss='logistic'): ε of randomized "
                                          "response on the training labels, once before training; 0 = off",
       lo=0.0),
    _k("out-dir", str, "", "run", "where the label owner writes report.json, metrics.csv (rewritten "
                                  "every round), decision_test.npy, run.png and report.html"),
    _k("route", str, "admm", "run", "how the model is built: 'admm' (vertical ADMM sharing), 'stacked-ssp' (every "
                                   "party private, one SSP release each, stacked by the label owner) or 'moment' "
                                   "(every party private, one label-moment release each, then ADMM sharing on the "
                                   "unlabelled held-out rows; docs/privacy_parties.md)",
       choices=("admm", "stacked-ssp", "moment")),
    # --- faults and deployment (label owner)
    _k("round-timeout", float, 600.0, "run", "seconds to wait for the parties' replies in one round",
       lo=0.0, lo_open=True),
    _k("party-wait", float, 120.0, "run", "seconds to wait for a missing party (every num-parties node "
                                          "at identify, a lost SuperNode to come back); 0: do not wait",
       lo=0.0),
    _k("stragglers", str, "wait", "run", "a party that misses a round: 'wait' for it (up to party-wait) or "
                                         "go on with its last release ('stale', bounded by max-staleness)",
       choices=("wait", "stale")),
    _k("max-staleness", int, 5, "run", "stragglers='stale': most consecutive rounds a party's last "
                                       "release may stand in for it", lo=1, hi=1000),
    _k("max-release", float, 1e6, "run", "the largest absolute value the label owner accepts in a party's release (s_m, test scores); beyond it the reply is refused naming the party", lo=0.0, lo_open=True),
    _k("wire-dtype", str, "float64", "run", "dtype of the N-vectors on the wire, both ways: 'float64' (exact) or "
                                            "'float32' (half the bytes; rounded once after any noise, upcast to "
                                            "float64 on receipt; docs/benchmarks.md)",
       choices=("float64", "float32")),
    _k("resume", str, "", "run", "a state folder of an earlier run: continue it from its last checkpoint"),
    _k("party-keys", str, "", "run", "JSON file mapping party -> SHA-256 fingerprint of the SuperNode "
                                     "auth public key allowed to serve it ('' = no binding)"),
    # --- secure aggregation of the releases (docs/secagg.md)
    _k("secagg", bool, False, "run", "secure aggregation: the parties mask their releases and the label owner "
                                     "decodes only their sum (docs/secagg.md)"),
    _k("secagg-name", str, "", "node", "secagg: the name this party's key is pinned under ('' = party<partition-id>)"),
    _k("secagg-signing-key", str, "", "node", "secagg: this party's Ed25519 PEM key file (signs its key advert)"),
    _k("secagg-pins", str, "", "node", "secagg: the other parties' Ed25519 public keys, name=<64 hex>, ... "
                                       "('' = unpinned: honest-but-curious central node only)"),
    _k("secagg-min-parties", int, 2, "node", "secagg: the fewest parties in a sum this party takes part in",
       lo=2, hi=1000),
    _k("secagg-require", str, "", "node", "secagg: comma-separated names that must be in every sum this party "
                                          "takes part in"),
    _k("secagg-bound", float, 1e4, "node", "secagg: the entry-wise bound on this party's releases (its "
                                           "fixed-point range)", lo=0.0, lo_open=True, hi=1e12),
    _k("secagg-only", bool, False, "node", "secagg: refuse to release anything unmasked"),
    _k("secagg-require-all", bool, True, "node", "secagg with secagg-pins: every pinned party must be in every sum "
                                                 "this party takes part in; false is a weakening (the central node "
                                                 "picks the first roster, docs/secagg.md)"),
    _k("secagg-trust", str, "malicious", "node", "secagg: 'malicious' (a deployed party then needs secagg-pins) or "
                                                 "'honest-but-curious' (accepts unpinned adverts: a central node that "
                                                 "relays its own key can read this party's release, docs/secagg.md)",
       choices=("malicious", "honest-but-curious")),
    # --- folders: the reader's own
    _k("data-dir", str, "", "both", "folder holding a9a and a9a.t (default ../shared/data/a9a from the working "
                                    "folder); the label owner's labels (run config), a party's columns (node config)"),
    _k("state-dir", str, "", "both", "checkpoint folder: the label owner's (run config; '' = "
                                     "<out-dir>/state) or a party's own (node config)"),
    # --- a party's privacy: its own node config wins
    _k("dp", bool, False, "node-first", "this party releases under differential privacy"),
    _k("dp-parties", str, "", "node-first", "which parties are private, e.g. '1' or '0,2' (empty: all)"),
    _k("dp-epsilon", float, 1.0, "party", "the party's total ε", lo=0.0, hi=100.0, lo_open=True),
    _k("dp-delta", float, 1e-5, "party", "the party's total δ (a horizontal agent: the δ at which dp-max-epsilon "
                                        "is accounted)", lo=0.0, hi=0.1, lo_open=True),
    _k("dp-train-rounds", int, 0, "party", "released training rounds after the warm start", lo=0,
       hi=10_000),
    _k("dp-eval-rounds", int, 1, "party", "evaluation releases budgeted", lo=0, hi=1000),
    _k("dp-plan-expiry", float, 86400.0, "node", "a private party: seconds without a release (nor a first resume since) after which a run's "
       "reserved plan lapses (a run that died and is never resumed does not hold the budget forever; "
       "docs/privacy.md)", lo=0.0),
    _k("dp-lam", float, 0.0, "party", "the private party's own λ (0: chosen from its own N and budget, 20 z/N at the default dp-b1 and dp-clip, z its noise multiplier: 0.1 on ~700 rows, 2.3e-3 on a9a at ε = 1)", lo=0.0),
    _k("dp-b1", float, 2.0, "party", "ball radius of x_m", lo=0.0, lo_open=True),
    _k("dp-clip", float, 10.0, "party", "clip of the x-update target and of released values",
       lo=0.0, lo_open=True),
    _k("dp-calibration", str, "strict", "party", "'strict' (sample-level) or 'paper' (Lemma 1)",
       choices=("strict", "paper")),
    _k("dp-noise", str, "output", "party", "'output' (Gaussian mechanism) or 'paper' (eq. 16)",
       choices=("output", "paper")),
    _k("dp-accountant", str, "exact", "party", "accountant of the party's ledger (rdp, prv need the opacus extra)", choices=ACCOUNTANTS),
    _k("dp-seed", int, -1, "party", "noise seed for in-process experiments only (flower-vfl fit --dp-seed); "
                                    "-1: fresh OS entropy. A party's or a horizontal agent's node config that "
                                    "sets it is refused: seeded noise repeats in every run",
       lo=-1, hi=2**63 - 1),
    _k("dp-distributed-max-colluders", int, -1, "node", "distributed noise (secagg=true, docs/privacy.md): this "
       "party accepts that the central node colludes with at most k other parties of a sum and adds only its "
       "share of the noise inside the secure sum; -1: off (the party adds its whole noise)", lo=-1, hi=10_000),
    # --- a SuperNode's identity and guards
    _k("partition-id", int, None, "node", "the party this SuperNode serves (required)", lo=0),
    _k("num-partitions", int, None, "node", "set by Flower's simulation engine; informational", lo=1),
    _k("max-answers", int, 0, "node", "most replies this party gives in one run (0: no cap)", lo=0),
    _k("min-rho", float, None, "node", "a party's own lower bound on the ρ it accepts (a private party that sets neither bound: 1e-3/N, N its own rows)", lo=0.0),
    _k("max-rho", float, None, "node", "a party's own upper bound on the ρ it accepts (a private party that sets neither bound: 1e3/N)", lo=0.0, lo_open=True),
    _k("moment-pool", str, "none", "node", "route='moment': 'test' lets this party's held-out rows serve as the "
                                           "unlabelled pool (their scores go to the label owner every round, not "
                                           "DP-protected); 'none' refuses the route", choices=("none", "test")),
    # --- a party's block model (core/blocks.py, docs/party-models.md): the run config may suggest the
    # kind, the party's node config wins; the kind's settings are the node config's
    _k("party-model", str, "linear", "node-first", "the party's block model: 'linear', feature maps 'rff', "
                                                  "'spline', 'bins' (data-independent), 'nystroem' (non-private "
                                                  "parties only) or 'mlp' (torch)", choices=tuple(PARTY_MODELS)),
    *(_k(s.name, s.type, s.default, "node", f"party-model {'/'.join(s.kinds)}: {s.help}", lo=s.lo, hi=s.hi)
      for s in PARTY_MODEL_SETTINGS.values()),
    # --- own data (flower_vfl.strategies.own_data, flower_vfl.clients.psi_party; docs/own-data.md)
    _k("mode", str, "train", "run", "own data: 'train' or 'predict'", choices=("train", "predict")),
    _k("labels-path", str, "", "run", "own data: the label owner's labelled training file"),
    _k("labels-test-path", str, "", "run", "own data: the label owner's labelled held-out file"),
    _k("score-ids-path", str, "", "run", "own data, mode=predict: the file naming the rows to score"),
    _k("id-column", str, "id", "both", "own data: the ID column"),
    _k("label-column", str, "label", "both", "own data: the label column of the label owner's files"),
    _k("model-dir", str, "", "both", "own data: where the model is saved"),
    _k("predictions-path", str, "", "run", "own data, mode=predict: the CSV written"),
    _k("psi-structure", str, "raw", "run", "own data: PSI setup structure", choices=("raw", "gcs", "bloom")),
    _k("psi-fpr", float, 1e-9, "run", "own data: PSI false-positive rate", lo=0.0, hi=1.0, lo_open=True,
       hi_open=True),
    *(_k(name, object, None, "node", "own data: a party's file settings (checked by "
                                     "flower_vfl.clients.psi_party; docs/own-data.md)")
      for name in ("data-path", "test-path", "score-path", "id-path", "columns", "categorical", "format",
                   "n-features", "sparse", "psi-max-request")),
    _k("psi-max-asked", float, 1.0, "node", "own data: a party's cap on the membership tests it ever answers (PSI request items plus "
       "agreed-order IDs it does not hold: one cap), per file and across all runs, as a multiple of its own number of IDs in that file (docs/own-data.md)",
       lo=0.0, lo_open=True),
    _k("preprocess", object, "none", "both", "own data: preprocessing of a party's columns (docs/own-data.md)"),
    # --- the horizontal app (flower_vfl.apps.horizontal): its run config, an agent's node config
    _k("hz-variant", str, "objt", "hz-run", "horizontal DP-IADMM variant (docs/reproduction-horizontal.md)",
       choices=HZ_VARIANTS),
    _k("hz-iterations", int, 100, "hz-run", "horizontal: iterations T", lo=1, hi=1_000_000),
    _k("hz-num-agents", int, 10, "hz-run", "horizontal: number of agents (one SuperNode each)", lo=1, hi=10_000),
    _k("hz-split", str, "iid", "hz-run", "horizontal: how Fashion-MNIST is split over agents",
       choices=("iid", "dirichlet")),
    _k("hz-dirichlet-alpha", float, 0.5, "hz-run", "horizontal, hz-split='dirichlet': concentration",
       lo=0.0, lo_open=True),
    _k("hz-a", float, 1.0, "hz-run", "horizontal: scale a of η_t = a/√t (ObjP) and δ_t = a/t² (ObjT)", lo=0.0, lo_open=True),
    _k("hz-beta", float, 1e-6, "hz-run", "horizontal: regularizer weight β of eq. (1)", lo=0.0),
    _k("hz-trust", str, "paper", "hz-run", "horizontal, ObjT: the radius δ_t, 'paper' a/t² or 'constant' a", choices=("paper", "constant")),
    _k("hz-eval-every", int, 10, "hz-run", "horizontal: evaluate every k iterations", lo=1),
    _k("dp-eps-bar", float, 0.0, "hz-node", "horizontal agent: per-iteration ε̄ (0: non-private)", lo=0.0),
    _k("dp-delta-bar", float, 1e-6, "hz-node", "horizontal agent: OutP's per-iteration δ̄", lo=0.0, hi=0.1,
       lo_open=True),
    _k("dp-sensitivity", str, "replace", "hz-node", "horizontal agent: 'replace' (data-independent; the default) or 'eq20' (the paper's data-dependent eq. 20, which a malicious server can drive to zero noise: only where the server is trusted)", choices=("eq20", "replace")),
    _k("dp-x-l1-max", float, None, "hz-node", "horizontal agent, dp-sensitivity='replace': bound on ‖x‖₁ of a sample (unset: the number of pixels)", lo=0.0,
       lo_open=True),
    _k("dp-max-epsilon", float, None, "hz-node", "horizontal agent: total ε it ever spends at dp-delta "
                                                 "(unset: no cap)", lo=0.0, lo_open=True),
])

#: the keys the horizontal app reads: its run config, an agent's node config
HORIZONTAL_RUN_KEYS = tuple(k for k, s in SCHEMA.items() if s.scope == "hz-run") + ("out-dir", "data-dir")
HORIZONTAL_NODE_KEYS = tuple(k for k, s in SCHEMA.items() if s.scope == "hz-node") + (
    "partition-id", "num-partitions", "data-dir", "state-dir", "dp-seed", "dp-delta")

#: run-config keys of earlier versions, never read: each named a party's files from the run
#: config, which only the party's node config may do; the node-config key to use instead
RETIRED = {"party-data-paths": "data-path", "party-test-paths": "test-path", "party-score-paths": "score-path",
           "party-model-dirs": "model-dir"}


def _suggest(key: str, pool) -> str:
    close = difflib.get_close_matches(key, list(pool), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _where(source: str, key: str) -> str:
    return f"--{key}" if source == "command line" else f"{source} key {key!r}"


def check_value(key: str, value, source: str = "run config"):
    """``value`` parsed as ``key`` says, or :class:`ConfigError` naming the key, the value and
    what is allowed. Integers are accepted for float keys; nothing else is converted."""
    if key not in SCHEMA:
        # a node config never takes a run-only key: neither suggest nor list one there
        pool = [k for k, s in SCHEMA.items() if not (source.startswith("node config") and s.scope in ("run", "hz-run"))]
        raise ConfigError(f"unknown {source} key {key!r}{_suggest(key, pool)}; known keys: "
                          f"{', '.join(sorted(pool))}")
    return _check(SCHEMA[key], value, source)


def _check(spec: Key, value, source: str):
    """:func:`check_value` for the declaration ``spec`` (a config key's or an argument's)."""
    key = spec.name
    if spec.type is object:
        return value

    def bad(problem=""):
        return ConfigError(f"{_where(source, key)}={value!r}{problem}: expected {spec.allowed()} "
                           f"({spec.help})")

    if spec.type is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if spec.type is str:
        if not isinstance(value, str):
            raise bad()
        if spec.choices is not None and value not in spec.choices:
            raise ConfigError(f"{_where(source, key)}={value!r} is not allowed{_suggest(value, spec.choices)}: "
                              f"expected {spec.allowed()} ({spec.help})")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad()
    if spec.type is int:
        if not isinstance(value, numbers.Integral):
            raise bad()
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise bad()
    lo, hi = spec.lo, spec.hi
    if lo is not None and (value < lo or (spec.lo_open and value == lo)):
        raise bad(" is out of range")
    if hi is not None and (value > hi or (spec.hi_open and value == hi)):
        raise bad(" is out of range")
    return value


def run_defaults() -> dict:
    """Defaults of every key the vertical app's run config may carry (== pyproject's
    [tool.flwr.app.config])."""
    return {k: s.default for k, s in SCHEMA.items() if s.scope in ("run", "node-first", "both")}


def _dp_parties(text: str, num_parties: int, source: str) -> None:
    items = text.replace(",", " ").split()
    if not all(p.isdigit() and int(p) < num_parties for p in items):
        raise ConfigError(f"{_where(source, 'dp-parties')}={text!r}: expected party ids between 0 and "
                          f"{num_parties - 1} separated by commas or spaces (num-parties={num_parties})")


def _not_a_run_key(key: str, value, source: str) -> ConfigError | None:
    """Why ``key`` may not be set in the vertical app's run config, or None when it may."""
    spec, where = SCHEMA.get(key), _where(source, key)
    if key in RETIRED:
        return ConfigError(f"{where}={value!r} is refused: only a party's own node config names its files; set "
                           f"{RETIRED[key]!r} in that party's --node-config (docs/own-data.md)")
    if spec is None:
        return None
    if spec.scope == "node":
        return ConfigError(f"{where} can only be set in a SuperNode's node config "
                           f"(--node-config \"{key}=...\"): {spec.help}")
    if spec.scope == "party":
        return ConfigError(f"{where}={value!r} is refused: it is a party's own privacy setting, read only from "
                           f"that party's node config (--node-config \"dp=true {key}=...\"; flower-vfl fit and "
                           f"simulate: --{key}, handed to the simulated parties): {spec.help}")
    if spec.scope in ("hz-run", "hz-node"):
        return ConfigError(f"{where}={value!r} is refused: it belongs to the horizontal app "
                           f"(flower_vfl.apps.horizontal), which this vertical run does not use: {spec.help}")
    return None


def parse_run_config(run_config, source: str = "run config") -> dict:
    """Every key of the vertical app's run config, typed and checked (defaults filled in).
    Refuses unknown keys, keys only a node config may set, a party's privacy keys (the party
    would ignore them), the horizontal app's keys and retired keys."""
    out = run_defaults()
    for key, value in dict(run_config or {}).items():
        if key in RETIRED and value == "":
            continue                      # an earlier version's declared default: never read
        err = _not_a_run_key(key, value, source)
        if err is not None:
            raise err
        if key not in SCHEMA:             # suggest, and list, only what a run config may set
            known = run_defaults()
            raise ConfigError(f"unknown {source} key {key!r}{_suggest(key, known)}; the run config's keys: "
                              f"{', '.join(sorted(known))}")
        out[key] = check_value(key, value, source)
    _dp_parties(out["dp-parties"], out["num-parties"], source)
    return out


def parse_node_config(node_config, run_config=None, source: str = "node config") -> dict:
    """A party's settings: its node config over the run config over the defaults, typed and
    checked. ``partition-id`` is required; run-scope keys in the node config are refused.

    The run config is the central node's: its privacy keys are not read at all (a party's
    budget is its own), a retired key is left to the party's own refusal, which names the party
    (:func:`flower_vfl.clients.source.refuse_party_keys`)."""
    node_config = dict(node_config or {})
    for key, value in node_config.items():
        if key in SCHEMA and SCHEMA[key].scope in ("run", "hz-run"):
            raise ConfigError(f"{_where(source, key)}={value!r} is refused: only the run config may set "
                              f"{key!r} ({SCHEMA[key].help}); remove it from --node-config")
        if key in SCHEMA and SCHEMA[key].scope == "hz-node":
            raise _not_a_run_key(key, value, source)
        check_value(key, value, source)
    out = parse_run_config({k: v for k, v in dict(run_config or {}).items() if k not in RETIRED and (
        SCHEMA.get(k) is None or SCHEMA[k].scope not in ("node", "party"))})
    out.update({k: s.default for k, s in SCHEMA.items() if s.scope in ("node", "party")})
    for key, value in node_config.items():
        out[key] = check_value(key, value, source)
    if out["partition-id"] is None:
        raise ConfigError(f"{source} key 'partition-id' is missing: every SuperNode must say which party "
                          "it serves, e.g. --node-config \"partition-id=0\"")
    if out["partition-id"] >= out["num-parties"]:
        raise ConfigError(f"{source} key 'partition-id'={out['partition-id']} is out of range: expected an "
                          f"integer between 0 and {out['num-parties'] - 1} (num-parties={out['num-parties']})")
    _dp_parties(out["dp-parties"], out["num-parties"], source)
    return out


def _parse_only(config, keys, source: str, app: str) -> dict:
    out = {k: SCHEMA[k].default for k in keys}
    for key, value in dict(config or {}).items():
        if key not in keys:
            known = f"known keys of the {app}: {', '.join(keys)}"
            if key in SCHEMA:
                raise ConfigError(f"{_where(source, key)}={value!r} is not read by the {app}; remove it ({known})")
            raise ConfigError(f"unknown {source} key {key!r}{_suggest(key, keys)}; {known}")
        out[key] = check_value(key, value, source)
    return out


def parse_horizontal_run_config(run_config, source: str = "run config") -> dict:
    """The horizontal app's run config (:data:`HORIZONTAL_RUN_KEYS`), typed, checked, defaults
    filled in; any other key is refused."""
    return _parse_only(run_config, HORIZONTAL_RUN_KEYS, source, "horizontal app's run config")


def parse_agent_node_config(node_config, source: str = "node config") -> dict:
    """A horizontal agent's node config (:data:`HORIZONTAL_NODE_KEYS`): typed and checked; the
    keys it does not set keep their defaults (None: unset)."""
    return _parse_only(node_config, HORIZONTAL_NODE_KEYS, source, "horizontal agent's node config")


def setting(key: str, run_config=None, node_config=None):
    """One key's value: from the node config when its scope lets a node set it, else the run
    config, else the default; checked against the schema."""
    if key not in SCHEMA:
        raise KeyError(f"unknown config key {key!r}{_suggest(key, SCHEMA)}")
    spec = SCHEMA[key]
    node_config, run_config = node_config or {}, run_config or {}
    if key in node_config:
        if spec.scope in ("run", "hz-run"):
            raise ConfigError(f"node config key {key!r}={node_config[key]!r} is refused: only the run config "
                              f"may set {key!r} ({spec.help}); remove it from --node-config")
        return check_value(key, node_config[key], "node config")
    if key in run_config and spec.scope not in ("node", "party", "hz-node"):
        return check_value(key, run_config[key], "run config")
    return spec.default


def markdown_table() -> str:
    """The README's key table, generated from the schema."""
    rows = ["| key | scope | default | allowed | meaning |", "|---|---|---|---|---|"]
    for k, s in SCHEMA.items():
        d = "(required)" if k == "partition-id" else "" if s.default is None else \
            str(s.default).lower() if s.type is bool else f"{s.default:g}" if s.type in (int, float) \
            else repr(s.default)
        rows.append(f"| `{k}` | {s.scope} | {d} | {s.allowed()} | {s.help} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ the Python arguments
# The same table validates the in-process estimator's and the strategies' arguments (as
# scikit-learn's ``_parameter_constraints``): each argument names the config key whose type,
# range and meaning it shares, or declares its own Key (scope 'api': no config sets it).

class ParamError(ConfigError, TypeError):
    """A Python argument the parameter table refuses: names the argument, the bad value, the
    accepted range and the fix (a ValueError and a TypeError, as scikit-learn's
    ``InvalidParameterError``)."""


@dataclass(frozen=True)
class Param:
    """One Python argument: ``key`` gives its type, range and meaning (``SCHEMA[config]`` when a
    config key sets it); ``none`` accepts None and ``also`` the listed values besides the range;
    ``objects`` passes a non-string object through (a Loss instance), checked where it is used."""

    key: Key
    config: str = ""
    none: bool = False
    also: tuple = ()
    objects: bool = False

    def allowed(self) -> str:
        extra = [repr(v) for v in self.also] + (["None"] if self.none else [])
        return self.key.allowed() + (" (or " + ", ".join(extra) + ")" if extra else "")


def _p(arg, config=None, **kw):
    return arg, Param(SCHEMA[config or arg.replace("_", "-")], config or arg.replace("_", "-"), **kw)


def _api(arg, type_, default, help, param_kw=None, **kw):
    return arg, Param(Key(arg, type_, default, "api", help, **kw), "", **(param_kw or {}))


#: argument -> its declaration; :func:`check_params` checks an estimator's or a strategy's
#: arguments against it. A config key's argument is named as the key with ``_`` for ``-``
#: unless given (``timeout`` is ``round-timeout``). Not here: ``label_epsilon`` (None, 0 or inf
#: turn it off; privacy/label_dp.py checks it where it is used), ``constraint``, ``party_keys``,
#: ``privacy`` (:func:`check_privacy`), callbacks and seeds
PARAMS: dict[str, Param] = dict([
    _p("num_parties"), _p("loss", objects=True), _p("penalty"), _p("lam"),
    _p("rho", none=True, also=("auto",)), _p("alpha"), _p("fit_intercept"), _p("acceleration"),
    _p("variant"), _p("x_solver"), _p("max_rounds"), _p("tol"), _p("eval_every"),
    _p("timeout", "round-timeout"), _p("party_wait"),
    _p("stragglers"), _p("max_staleness"), _p("max_release"), _p("wire_dtype"), _p("secagg"),
    _p("state_dir", none=True, objects=True), _p("resume", none=True, objects=True),
    _api("tol_abs", float, DEFAULT_TOL_ABS, "absolute residual tolerance of Boyd's stopping rule (3.3.1)", lo=0.0),
    _api("adaptive_rho", bool, False, "residual balancing of rho (Boyd 3.4.1)"),
    _api("l1_ratio", float, 0.5, "penalty='elasticnet': the share of the L1 term", lo=0.0, hi=1.0),
    _api("verbose", bool, False, "show a progress bar"),
    _api("privacy_budget", float, None, "each private party's total epsilon over every fit charging "
         "privacy_ledger", {"none": True}, lo=0.0, lo_open=True),
])

#: the horizontal DP-IADMM server's arguments (flower_vfl.strategies.dpiadmm.DPIADMMConfig): the
#: horizontal run config's ``hz-*`` key where one sets it, else its own declaration
DPIADMM_PARAMS: dict[str, Param] = dict([
    _p("variant", "hz-variant"), _p("num_agents", "hz-num-agents"), _p("num_iterations", "hz-iterations"),
    _p("a", "hz-a"), _p("beta", "hz-beta"), _p("trust", "hz-trust"), _p("eval_every", "hz-eval-every"),
    _api("num_features", int, 784, "J, the features of every agent's rows", lo=1),
    _api("num_classes", int, 10, "K, the classes of the multiclass logistic regression", lo=2),
    _api("box", float, 1.0, "the box W = [-box, box]^(J x K) of w and every z_p", lo=0.0, lo_open=True),
    _api("c1", float, 2.0, "rho_t = min{rho_max, c1 * 1.2^floor(t/Tc) + c2/eps_bar} (eq. 21): c1", lo=0.0, lo_open=True),
    _api("c2", float, 5.0, "rho_t (eq. 21): c2, the weight of 1/eps_bar", lo=0.0),
    _api("Tc", float, 1e4, "rho_t (eq. 21): Tc, the iterations between two 1.2x steps", lo=0.0, lo_open=True),
    _api("rho_max", float, 1e9, "rho_t (eq. 21): rho_max, its cap", lo=0.0, lo_open=True),
    _api("timeout", float, 600.0, "seconds to wait for the agents' replies in one round", lo=0.0, lo_open=True),
    _api("party_wait", float, 0.0, "seconds to wait for a missing agent (at identify, a lost node to come "
         "back); 0: do not wait", lo=0.0),
])

#: the vertical SGD baseline's label owner's arguments (flower_vfl.routes.vertical_sgd.config.SGDConfig):
#: a library route, no run config sets them; the vertical run config's key where one shares the meaning
SGD_PARAMS: dict[str, Param] = dict([
    _p("num_parties"), _p("loss", objects=True), _p("fit_intercept"), _p("timeout", "round-timeout"),
    _api("lr", float, 0.1, "the SGD step size", lo=0.0, lo_open=True),
    _api("lr_schedule", str, "constant", "the step size over the steps: 'constant' lr, 'inverse' "
         "lr/(1 + lr_decay*step), 'sqrt' lr/sqrt(1 + lr_decay*step)", choices=("constant", "inverse", "sqrt")),
    _api("lr_decay", float, 0.0, "the decay of the 'inverse' and 'sqrt' schedules", lo=0.0),
    _api("batch_size", int, 256, "rows per SGD step (None: every row)", {"none": True}, lo=1),
    _api("max_epochs", int, 20, "epochs (a round is an epoch)", lo=1, hi=1_000_000),
    _api("init_scale", float, 0.01, "the scale of the parties' random initial x_m", lo=0.0),
    _api("seed", int, 0, "the shared seed of the batches and the parties' initial x_m", lo=0, hi=2**63 - 1),
    _api("eval_every", int, 1, "evaluate every k epochs and after the last (0: only after the last)", lo=0),
    _api("party_wait", float, 0.0, "seconds to wait for a missing party (at identify, a lost node to come "
         "back; a restarted SGD party has lost its x_m); 0: do not wait", lo=0.0),
])

#: a PrivacyConfig field -> the party key (node config ``dp-*``) whose range it shares
PRIVACY_FIELDS = {"epsilon": "dp-epsilon", "delta": "dp-delta", "train_rounds": "dp-train-rounds",
                  "eval_rounds": "dp-eval-rounds", "calibration": "dp-calibration", "noise_form": "dp-noise",
                  "accountant": "dp-accountant", "b1": "dp-b1", "c_v": "dp-clip", "c_s": "dp-clip",
                  "seed": "dp-seed", "lam": "dp-lam", "plan_expiry": "dp-plan-expiry"}


def check_param(owner: str, name: str, value, param: Param | None = None):
    """``value`` of argument ``name`` of ``owner`` (e.g. ``'VerticalADMM'``) as :data:`PARAMS`
    declares it, converted as :func:`check_value` does; or :class:`ParamError` naming the
    argument, the value, what is accepted and the fix."""
    param = param or PARAMS[name]
    if value is None and param.none:
        return None
    if param.objects and not isinstance(value, str):
        return value
    if any(value is v or (type(value) is type(v) and value == v) for v in param.also):
        return value
    if isinstance(value, np.bool_):
        value = bool(value)
    try:
        return _check(param.key, value, "api")
    except ConfigError:
        pass
    shown = next((v for v in param.also if isinstance(v, str)), param.key.default)
    default = "" if shown is None else f", e.g. the default {name}={shown!r}"
    where = f"; run config key {param.config!r}" if param.config and SCHEMA[param.config].scope in (
        "run", "node-first", "both", "hz-run") else f"; node config key {param.config!r}" if param.config else ""
    raise ParamError(f"{owner}({name}={value!r}) is refused: expected {param.allowed()} ({param.key.help}{where}); "
                     f"pass {name}= such a value{default}")


def check_params(owner: str, values: dict, table: dict | None = None) -> dict:
    """Every argument of ``values`` that :data:`PARAMS` (or ``table``) declares, checked by
    :func:`check_param`; the others are left to the code that uses them. Returns the checked
    values."""
    table = PARAMS if table is None else table
    return {k: check_param(owner, k, v, table[k]) if k in table else v for k, v in values.items()}


def check_privacy(owner: str, privacy, n_blocks: int):
    """``privacy`` of the in-process estimator: None, or one PrivacyConfig (or None) per block,
    each field in its party key's range (:data:`PRIVACY_FIELDS`)."""
    from flower_vfl.privacy.party import PrivacyConfig
    if privacy is None:
        return None
    if isinstance(privacy, (str, bytes, dict)) or not hasattr(privacy, "__len__"):
        raise ParamError(f"{owner}(privacy={privacy!r}) is refused: expected None or a list with one entry per "
                         f"party ({n_blocks}), each None (non-private) or a flower_vfl.privacy.PrivacyConfig; pass "
                         f"e.g. privacy=[None, PrivacyConfig(epsilon=1.0, train_rounds=5)]")
    if len(privacy) != n_blocks:
        raise ParamError(f"{owner}(privacy=...) has {len(privacy)} entries but there are {n_blocks} blocks: "
                         "expected one per party; give one PrivacyConfig (or None) per party")
    for m, cfg in enumerate(privacy):
        if cfg is None:
            continue
        if not isinstance(cfg, PrivacyConfig):
            raise ParamError(f"{owner}(privacy[{m}]={cfg!r}) is refused: expected None (non-private) or a "
                             "flower_vfl.privacy.PrivacyConfig; pass e.g. PrivacyConfig(epsilon=1.0, train_rounds=5)")
        for field_, key in PRIVACY_FIELDS.items():
            value = getattr(cfg, field_)
            none = field_ in ("seed", "lam")
            check_param(f"{owner}: privacy[{m}] = PrivacyConfig", field_, value,
                        Param(SCHEMA[key], key, none=none))
    return privacy


# ------------------------------------------------------------------ environment variables
@dataclass(frozen=True)
class EnvVar:
    """One ``FLOWER_VFL_*`` environment variable: its default (None: unset), who reads it and why."""

    name: str
    default: str | None
    reader: str
    help: str


#: every environment variable the package reads (tests/test_config_schema.py checks the source
#: names no other); none is a configuration key: each names a folder of this machine, or is a
#: benchmark's switch
ENVIRONMENT: dict[str, EnvVar] = {e.name: e for e in (
    EnvVar("FLOWER_VFL_NODE_CONFIG", None, "flower_vfl.clients.source.party_node_config",
           "a JSON file {partition-id: {key: value}} merged under a party's node config (flower-vfl simulate "
           "hands the simulated parties their privacy settings this way)"),
    EnvVar("FLOWER_VFL_STATE_DIR", None, "flower_vfl.privacy.store.default_state_dir",
           "a party's state folder when its node config names none (default ~/.flower-vfl/party-state)"),
    EnvVar("FLOWER_VFL_CACHE", None, "flower_vfl.io.data",
           "where the bundled datasets' files with IDs are written (default ~/.cache/flower-vfl/bundled)"),
    EnvVar("FLOWER_VFL_BLOCK_CACHE", "1", "flower_vfl.io.party_cache",
           "0/false/no/off turns a party's cache of its parsed block off"),
    EnvVar("FLOWER_VFL_WARM_BLOCKS", "1", "flower_vfl.deploy.warm_exec",
           "0/false/no/off: a party's warm executor does not map the verified cached blocks its forked "
           "ClientApps were served (each child reads and checks its block itself; benchmarks compare the two)"),
    EnvVar("FLOWER_VFL_APP_DIR", None, "flower_vfl.cli.app.app_dir",
           "the Flower app folder the CLI writes (default $XDG_CACHE_HOME/flower-vfl/app)"),
    EnvVar("FLOWER_VFL_RUNTIME_DIR", None, "flower_vfl.deploy.local.superlink_registry",
           "where the SuperLinks this package starts are recorded (default $XDG_RUNTIME_DIR/flower-vfl)"),
    EnvVar("FLOWER_VFL_TIMING", None, "flower_vfl.strategies.exchange, flower_vfl.deploy",
           "benchmarks: a file the exchange and the deployed nodes append timing lines to"),
    EnvVar("FLOWER_VFL_GRID_PULL", None, "flower_vfl.strategies.exchange.send_and_receive",
           "benchmarks: 'flower' uses Flower's own send_and_receive loop instead of the exchange's polling"),
    EnvVar("FLOWER_VFL_SIM_WAKE", "1", "flower_vfl.strategies.sim_delivery",
           "benchmarks: 0 turns off waking the simulation's delivery thread after a push"),
    EnvVar("FLOWER_VFL_FAB_RESEND", None, "flower_vfl.deploy.installed_fab.resend_fabs",
           "1/true/yes/on: flower-vfl-supernode sends the FAB's content to every ClientApp with every message, as "
           "Flower does, also to a forked ClientApp that installed it (benchmarks compare the two)"),
)}
