"""Moved: vertical SGD on the FDML composite model is the in-process reference of the
``vertical-sgd`` route, ``flower_vfl.routes.vertical_sgd.reference``. These names are kept for
existing imports."""

from flower_vfl.routes.vertical_sgd.reference import (FLOAT_BYTES, SCHEDULES, SGDCentral, SGDParty, VerticalSGD,
                                                       batch_indices, eval_metrics, init_coef, learning_rate,
                                                       n_batches)

__all__ = ["VerticalSGD", "SGDParty", "SGDCentral", "batch_indices", "learning_rate", "init_coef", "SCHEDULES",
           "eval_metrics", "n_batches", "FLOAT_BYTES"]
