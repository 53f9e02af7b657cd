"""Differential privacy for the parties: accounting, the party's one ledger (on its store), the noise.

Nothing here imports flwr; opacus (and torch) are imported lazily, only for the
``"rdp"`` and ``"prv"`` accounting methods. Names load on first use, so a non-private
party's message handler never imports dp-accounting.
"""

from importlib import import_module

_LAZY = {
    "METHODS": "accounting", "available_methods": "accounting", "calibrate_sigma": "accounting",
    "composed_event": "accounting", "epsilon_for_events": "accounting",
    "epsilon_for_releases": "accounting", "epsilon_spent": "accounting",
    "noise_multiplier_for": "accounting", "paper_round_epsilon": "accounting",
    "Budget": "ledger", "BudgetExceeded": "ledger", "Ledger": "ledger",
    "FORMS": "mechanism", "GaussianOutputMechanism": "mechanism",
    "PrivacyConfig": "party", "PrivateParty": "party",
    "PartyStore": "store",
}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module("." + _LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
