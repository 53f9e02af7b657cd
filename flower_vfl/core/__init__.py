"""The ADMM sharing math (no Flower imports): losses, penalties, party and central updates.

Nothing here imports a module above ``core`` (the estimator is ``flower_vfl.estimator``).
"""

from importlib import import_module

_LAZY = {"default_rho": ".schedule", "private_schedule": ".schedule", "CentralUpdate": ".central",
         "get_loss": ".losses", "PartyUpdate": ".party", "get_penalty": ".penalties"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
