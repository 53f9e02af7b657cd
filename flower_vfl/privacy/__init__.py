"""Differential privacy for the vertical parties: accounting, the party's ledger, the noise.

Nothing here imports flwr; opacus (and torch) are imported lazily, only for the
``"rdp"`` and ``"prv"`` accounting methods.
"""

from .accounting import (
    METHODS,
    available_methods,
    composed_event,
    epsilon_for_releases,
    epsilon_spent,
    noise_multiplier_for,
    paper_round_epsilon,
)
from .ledger import BudgetExceeded, LedgerEntry, PrivacyLedger, calibrate_sigma
from .mechanism import FORMS, GaussianOutputMechanism, ReplayMismatch, release_hash
from .party import PrivacyConfig, PrivateParty

__all__ = [
    "METHODS",
    "FORMS",
    "BudgetExceeded",
    "GaussianOutputMechanism",
    "LedgerEntry",
    "PrivacyConfig",
    "PrivateParty",
    "PrivacyLedger",
    "ReplayMismatch",
    "available_methods",
    "calibrate_sigma",
    "composed_event",
    "epsilon_for_releases",
    "epsilon_spent",
    "noise_multiplier_for",
    "paper_round_epsilon",
    "release_hash",
]
