"""flower-vfl: vertical federated learning (ADMM sharing) with differential privacy for Flower."""

__version__ = "0.1.0"
__all__ = ["VerticalADMM", "BlockedVerticalADMM", "__version__"]


def __getattr__(name):
    # loaded on first use: the estimator imports scikit-learn (~1.5-6 s), which a party's message
    # handler (a fresh process per message on a real SuperNode) does not need
    if name == "VerticalADMM":
        from flower_vfl.estimator.engine import VerticalADMM
        return VerticalADMM
    if name == "BlockedVerticalADMM":           # one X with declared column blocks (GridSearchCV)
        from flower_vfl.estimator.blocked import BlockedVerticalADMM
        return BlockedVerticalADMM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
