"""Baselines the paper compares ADMM sharing against (no Flower imports).

- :class:`VerticalSGD`: the FDML composite-model vertical SGD (Hu et al., KDD 2019), the
  method of the paper's Figures 1-2 (the in-process reference of the ``vertical-sgd`` route,
  ``flower_vfl.routes.vertical_sgd.reference``, re-exported here);
- :func:`centralized_logreg`, :func:`local_only_logreg`: scikit-learn ``LogisticRegression``
  at the project's regularization (:func:`lam_to_C`), the horizontal lines of Figure 3.
"""
from flower_vfl.routes.vertical_sgd.reference import SGDCentral, SGDParty, VerticalSGD, batch_indices, learning_rate

#: imported on first use (PEP 562): scikit-learn is ~1.3 s of imports that the Flower strategies
#: (which import the SGD reference through this package) never need
_SKLEARN = ("C_to_lam", "centralized_logreg", "lam_to_C", "local_only_logreg", "logreg_objective")

__all__ = ["VerticalSGD", "SGDParty", "SGDCentral", "batch_indices", "learning_rate", "lam_to_C",
           "C_to_lam", "centralized_logreg", "local_only_logreg", "logreg_objective"]


def __getattr__(name):
    if name in _SKLEARN:
        from flower_vfl.baselines import sklearn_baselines
        return getattr(sklearn_baselines, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
