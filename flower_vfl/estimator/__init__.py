"""The in-process estimator with a scikit-learn API (``VerticalADMM``) and its save/load.

Loaded on first use: it imports scikit-learn, which a party's message handler does not need.
"""


def __getattr__(name):
    if name == "VerticalADMM":
        from flower_vfl.estimator.engine import VerticalADMM
        return VerticalADMM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
