"""Moved: the vertical SGD baseline's central node is ``flower_vfl.routes.vertical_sgd.central``
(the ``vertical-sgd`` route folder). This name is kept for existing imports."""

from flower_vfl.routes.vertical_sgd.central import VerticalSGDStrategy

__all__ = ["VerticalSGDStrategy"]
