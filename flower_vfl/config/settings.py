"""Run-config / node-config keys shared by the ServerApp, the ClientApp and the CLI."""

from __future__ import annotations

__all__ = ["PRIVACY_KEYS", "RUN_DEFAULTS", "dp_party_ids", "run_setting", "privacy_from_config", "default_dp_lam",
           "DP_SCORE_NOISE"]

from flower_vfl.config.schema import SCHEMA, run_defaults, setting

#: every key a run config may carry, with its default (flower_vfl.config.schema owns types, ranges,
#: scopes and meanings; pyproject's [tool.flwr.app.config] declares the same defaults)
RUN_DEFAULTS = run_defaults()


def run_setting(key, run_config, node_config=None):
    """A value from the node config (when the key's scope lets a node set it), else the run
    config, else the default; checked against :mod:`flower_vfl.config.schema` (a bad value raises
    :class:`~flower_vfl.config.schema.ConfigError` naming the key and the allowed values)."""
    return setting(key, run_config, node_config)


def dp_party_ids(run_config, num_parties: int) -> set[int]:
    """The parties the run config asks to be private (``dp-parties``; empty: all); unknown
    ids are an error naming the key, never a silently non-private run."""
    from flower_vfl.config.schema import ConfigError
    raw = str((run_config or {}).get("dp-parties", "")).strip()
    if not raw:
        return set(range(num_parties))
    try:
        ids = {int(p) for p in raw.replace(",", " ").split()}
    except ValueError:
        raise ConfigError(f"run config dp-parties={raw!r}: give party ids 0..{num_parties - 1} separated by "
                          "spaces or commas") from None
    bad = sorted(i for i in ids if not 0 <= i < num_parties)
    if bad:
        raise ConfigError(f"run config dp-parties={raw!r} names parties {bad}, but the run has parties "
                          f"0..{num_parties - 1} (num-parties={num_parties}); fix dp-parties")
    return ids


#: the keys that make up a party's privacy settings, read only from its node config (its budget
#: is its own): every ``party``-scope key of the schema. ``dp-seed`` among them exists for
#: in-process experiments only: a party's node config that sets it is refused
PRIVACY_KEYS = tuple(k for k, s in SCHEMA.items() if s.scope == "party")


#: the per-row noise (in logits) of a private party's released model that its default dp-lam aims at,
#: at the protocol's default rho: ~0.1 keeps its scores useful and its lam small enough to fit them
DP_SCORE_NOISE = 0.12
#: rho_x * N at the default rho of a logistic run with 2 parties (rho = 0.05/N, theta = 1/2:
#: core/schedule.py, core/rounds.py): the scale the default is computed at
RHO_X_N = 0.1


def default_dp_lam(n_rows: int, config) -> float:
    """A private party's λ when its node config leaves ``dp-lam`` unset (0): from its own row
    count N and its own budget, never from a run tuned elsewhere (a9a's 3e-3 on Titanic's ~900
    rows gave 0.39 accuracy, below the majority class).

    The released model is x~ = x + N(0, sigma^2 I) with sigma = z C_x, C_x = 2 rho_x (b1 + c_v) / lam
    (:func:`~flower_vfl.privacy.sensitivity.strict_param_sensitivity`), z the noise multiplier of
    the party's plan; its rows have unit norm, so each released score carries noise of std sigma.
    At the default rho (rho_x N = :data:`RHO_X_N`) the λ that makes that std
    :data:`DP_SCORE_NOISE` is ``2 RHO_X_N (b1 + c_v) z / (DP_SCORE_NOISE N)`` = 20 z / N at the
    default dp-b1 = 2, dp-clip = 10. At ε = 1 (one release, z = 3.73): 0.105 on 712 rows
    (Titanic's training folds: 5-fold cross-validated accuracy 0.784 / 0.720, mean of 3 noise
    seeds, against 0.787 / 0.704 for the non-private party alone, whichever party is private;
    dp-lam 3e-3 gave 0.640 / 0.633), 2.3e-3 on a9a (0.8200 / 0.8464 against 0.8197 / 0.8465 at the
    3e-3 validation picked there): tests/test_dp_lam_default.py."""
    from flower_vfl.privacy.accounting import noise_multiplier_for
    z = noise_multiplier_for(config.epsilon, config.delta, int(config.train_rounds) + int(config.eval_rounds),
                             config.accountant)
    return 2.0 * RHO_X_N * (float(config.b1) + float(config.c_v)) * float(z) / (DP_SCORE_NOISE * max(int(n_rows), 1))


def privacy_from_config(party: int, run_config, node_config=None, n_rows: int | None = None):
    """The party's PrivacyConfig from its own node config, or None when it releases exact values.

    The run config is written by the server side, so it can only ask for *more* privacy: a
    party is private when its node config says so (``dp=true``, or a ``dp-epsilon`` without
    ``dp=false``) or when the run config asks (``dp=true`` and the party in ``dp-parties``).
    Every privacy setting comes from the node config (missing keys: the defaults); a run
    config's ``dp-*`` values are ignored. A party asked to be private without a node-level
    budget refuses to start. ``dp-lam`` unset (0): :func:`default_dp_lam` from the party's own
    ``n_rows`` (its aligned training rows); without ``n_rows``, the run's lam (the Python API's
    ``PrivacyConfig(lam=None)``).
    """
    from flower_vfl.config.schema import SCHEMA, check_value
    nc, rc = dict(node_config or {}), dict(run_config or {})
    defaults = {k: spec.default for k, spec in SCHEMA.items()}
    node_dp = check_value("dp", nc["dp"], "node config") if "dp" in nc else None
    node_private = node_dp is True or (node_dp is None and "dp-epsilon" in nc)
    run_wants = False
    if bool(rc.get("dp", False)):
        n = int(rc.get("num-parties", defaults["num-parties"]))
        run_wants = party in dp_party_ids(rc, max(n, party + 1))
    if not (node_private or run_wants):
        return None
    if "dp-epsilon" not in nc:
        from flower_vfl.config.schema import ConfigError
        raise ConfigError(
            f"party {party}: the run config asks this party to be private (dp=true, dp-parties="
            f"{rc.get('dp-parties', '')!r}) but its node config declares no budget. A party's privacy "
            "settings come only from its own node config: start the SuperNode with --node-config "
            "\"... dp=true dp-epsilon=<ε> dp-delta=<δ>\" (and optionally dp-lam, dp-train-rounds, "
            "dp-eval-rounds, state-dir)")
    get = lambda k: check_value(k, nc[k], "node config") if k in nc else defaults[k]  # noqa: E731
    from flower_vfl.privacy.party import PrivacyConfig
    lam = float(get("dp-lam"))
    cfg = PrivacyConfig(epsilon=float(get("dp-epsilon")), delta=float(get("dp-delta")),
                         train_rounds=int(get("dp-train-rounds")), eval_rounds=int(get("dp-eval-rounds")),
                         lam=lam if lam > 0 else None,
                         seed=int(get("dp-seed")) if int(get("dp-seed")) >= 0 else None,
                         calibration=str(get("dp-calibration")), noise_form=str(get("dp-noise")),
                         accountant=str(get("dp-accountant")), b1=float(get("dp-b1")),
                         c_v=float(get("dp-clip")), c_s=float(get("dp-clip")),
                         plan_expiry=float(get("dp-plan-expiry")))
    if cfg.lam is None and n_rows is not None:
        cfg.lam = default_dp_lam(n_rows, cfg.validate())
    return cfg
