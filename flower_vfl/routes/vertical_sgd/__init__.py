"""The ``vertical-sgd`` route: the FDML-style vertical SGD baseline (Hu et al., KDD 2019).

One folder: its central node (:mod:`.central`, ``VerticalSGDStrategy``: the label owner, one
Flower round trip per SGD step), its party (:mod:`.party`, ``VerticalSGDPartyClient`` and the
ClientApp handlers ``SGD_HANDLERS``) and its in-process reference (:mod:`.reference`,
``VerticalSGD``, and the two sides' math both of the others call). A library route: its message
types are the ADMM route's, so it has no place in the project's ClientApp; build one with
``flower_vfl.routes.client_app("vertical-sgd")``, or run it in process on
``flower_vfl.deploy.local_grid.LocalGrid``.
"""

from flower_vfl.routes.route import Route

ROUTE = Route("vertical-sgd", "vertical SGD on the FDML composite model (the paper's baseline)", None,
              "flower_vfl.routes.vertical_sgd.central:VerticalSGDStrategy",
              "flower_vfl.routes.vertical_sgd.party:VerticalSGDPartyClient",
              "flower_vfl.routes.vertical_sgd.reference:VerticalSGD",
              ("query.identify", "train", "evaluate"),
              handlers="flower_vfl.routes.vertical_sgd.party:SGD_HANDLERS")
