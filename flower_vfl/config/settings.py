"""Run-config / node-config keys shared by the ServerApp, the ClientApp and the CLI."""

from __future__ import annotations

__all__ = ["PRIVACY_KEYS", "RUN_DEFAULTS", "dp_party_ids", "run_setting", "privacy_from_config"]

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


def privacy_from_config(party: int, run_config, node_config=None):
    """The party's PrivacyConfig from its own node config, or None when it releases exact values.

    The run config is written by the server side, so it can only ask for *more* privacy: a
    party is private when its node config says so (``dp=true``, or a ``dp-epsilon`` without
    ``dp=false``) or when the run config asks (``dp=true`` and the party in ``dp-parties``).
    Every privacy setting comes from the node config (missing keys: the defaults); a run
    config's ``dp-*`` values are ignored. A party asked to be private without a node-level
    budget refuses to start.
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
    return PrivacyConfig(epsilon=float(get("dp-epsilon")), delta=float(get("dp-delta")),
                         train_rounds=int(get("dp-train-rounds")), eval_rounds=int(get("dp-eval-rounds")),
                         lam=lam if lam > 0 else None,
                         seed=int(get("dp-seed")) if int(get("dp-seed")) >= 0 else None,
                         calibration=str(get("dp-calibration")), noise_form=str(get("dp-noise")),
                         accountant=str(get("dp-accountant")), b1=float(get("dp-b1")),
                         c_v=float(get("dp-clip")), c_s=float(get("dp-clip")))
