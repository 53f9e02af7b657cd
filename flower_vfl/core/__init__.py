"""The ADMM sharing math (no Flower imports): losses, penalties, party and central updates.

Names are loaded on first use: the estimator (``VerticalADMM``) pulls in scikit-learn, which a
party's message handler, a fresh process per message on a real SuperNode, does not need.
"""

from importlib import import_module

_LAZY = {"VerticalADMM": ".engine", "default_rho": ".engine", "CentralUpdate": ".central",
         "get_loss": ".losses", "PartyUpdate": ".party", "get_penalty": ".penalties"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
