"""Moved: the vertical SGD baseline's party is ``flower_vfl.routes.vertical_sgd.party`` (the
``vertical-sgd`` route folder). These names are kept for existing imports."""

from flower_vfl.routes.vertical_sgd.party import SGD_HANDLERS, VerticalSGDPartyClient, make_sgd_client

__all__ = ["VerticalSGDPartyClient", "make_sgd_client", "SGD_HANDLERS"]
