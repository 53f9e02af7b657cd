"""Baselines the paper compares ADMM sharing against (no Flower imports).

- :class:`VerticalSGD`: the FDML composite-model vertical SGD (Hu et al., KDD 2019), the
  method of the paper's Figures 1-2;
- :func:`centralized_logreg`, :func:`local_only_logreg`: scikit-learn ``LogisticRegression``
  at the project's regularization (:func:`lam_to_C`), the horizontal lines of Figure 3.
"""
from flower_vfl.baselines.sgd import SGDCentral, SGDParty, VerticalSGD, batch_indices, learning_rate
from flower_vfl.baselines.sklearn_baselines import C_to_lam, centralized_logreg, lam_to_C, local_only_logreg, logreg_objective

__all__ = ["VerticalSGD", "SGDParty", "SGDCentral", "batch_indices", "learning_rate", "lam_to_C",
           "C_to_lam", "centralized_logreg", "local_only_logreg", "logreg_objective"]
