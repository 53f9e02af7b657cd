"""Flower party clients: ``from flower_vfl.clients import VerticalPartyClient``.

Loaded on first use: on a real SuperNode every message starts a fresh process, which should
import only the client it runs.
"""

from importlib import import_module

_LAZY = {
    "VerticalPartyClient": ".vertical_party",       # builds one of the two below
    "PublicPartyClient": ".party_public",
    "PrivatePartyClient": ".party_private",
    "DPIADMMClient": ".dpiadmm",                    # horizontal DP inexact ADMM agent
    "VerticalSGDPartyClient": ".vertical_sgd",      # FDML-style vertical SGD baseline
    "SSPPartyClient": ".party_ssp",                 # stacked SSP route: one SSP release per private party
    "MomentPartyClient": ".party_moment",           # moment route: one moment release, ADMM on the pool
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
