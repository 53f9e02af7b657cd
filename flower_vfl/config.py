"""Run-config / node-config keys shared by the ServerApp, the ClientApp and the CLI."""

from __future__ import annotations

__all__ = ["RUN_DEFAULTS", "run_setting", "privacy_from_config"]

RUN_DEFAULTS = {
    "dataset": "breast_cancer", "num-parties": 2, "loss": "logistic", "penalty": "l2",
    "lam": 1e-4, "rho": 0.0, "alpha": 1.0, "fit-intercept": True, "max-rounds": 50, "tol": 0.0,
    "eval-every": 0, "out-dir": "", "data-dir": "",
    # privacy (a party's node config overrides the run config: the budget is the party's)
    "dp": False, "dp-epsilon": 1.0, "dp-delta": 1e-5, "dp-train-rounds": 0, "dp-eval-rounds": 1,
    "dp-calibration": "strict", "dp-noise": "output", "dp-accountant": "exact",
    "dp-b1": 2.0, "dp-clip": 10.0, "dp-parties": "", "dp-lam": 0.0,
    "dp-seed": -1,
}


def run_setting(key, run_config, node_config=None):
    """A value from the node config, else the run config, else the default."""
    for src in (node_config or {}, run_config or {}):
        if key in src:
            return src[key]
    if key not in RUN_DEFAULTS:
        raise KeyError(f"unknown config key {key!r}")
    return RUN_DEFAULTS[key]


def privacy_from_config(party: int, run_config, node_config=None):
    """The party's PrivacyConfig, or None when this party releases exact values."""
    get = lambda k: run_setting(k, run_config, node_config)  # noqa: E731
    if not get("dp"):
        return None
    parties = str(get("dp-parties")).strip()
    if parties and party not in {int(p) for p in parties.replace(",", " ").split()}:
        return None
    from .privacy.party import PrivacyConfig
    lam = float(get("dp-lam"))
    return PrivacyConfig(epsilon=float(get("dp-epsilon")), delta=float(get("dp-delta")),
                         train_rounds=int(get("dp-train-rounds")), eval_rounds=int(get("dp-eval-rounds")),
                         lam=lam if lam > 0 else None,
                         seed=int(get("dp-seed")) if int(get("dp-seed")) >= 0 else None,
                         calibration=str(get("dp-calibration")), noise_form=str(get("dp-noise")),
                         accountant=str(get("dp-accountant")), b1=float(get("dp-b1")),
                         c_v=float(get("dp-clip")), c_s=float(get("dp-clip")))
