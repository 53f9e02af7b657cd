"""The routes: one registry of what the central node and the parties run, by name.

A route is how a model is built over the parties: its central node (a Flower ``Strategy`` that
keeps ``start(grid, initial_arrays, num_rounds, timeout, ...) -> Result``), its party (the
handlers of the messages that central node sends) and its in-process reference (the same math,
no Flower). A new route is a folder, ``routes/<name>/`` with ``central.py``, ``party.py``,
``reference.py`` and a ``ROUTE`` in its ``__init__.py`` (``routes/vertical_sgd/`` is one), plus
its line in :data:`REGISTRY` below (and the import above it).

The apps are built from this registry: the project's ClientApp (``apps/client.py``) registers the
handler of every message type of the routes whose ``app`` is ``"vertical"`` (the run config's
``route`` picks one; the ServerApp, ``apps/server.py``, builds its central node), the horizontal
pair (``apps/horizontal.py``) those of ``"horizontal"``; a route with its own ``handlers`` and no
``app`` (a library route) gets its ClientApp from :func:`client_app` (your own app, or
``flower_vfl.deploy.local_grid.LocalGrid`` in process). Two routes of one app never claim the same
message type (checked when the registry loads).

Importing ``flower_vfl.routes`` (or a route's ``reference``) imports no Flower and no route's code.
"""

from __future__ import annotations

from collections.abc import Callable

from flower_vfl.routes.route import Route

from flower_vfl.routes.vertical_sgd import ROUTE as VERTICAL_SGD  # route folders: one line each

__all__ = ["Route", "REGISTRY", "routes", "get", "for_app", "register", "client_app"]

#: the registry: the existing routes, then the route folders
REGISTRY: tuple[Route, ...] = (
    Route("admm", "vertical ADMM sharing (own data, secure aggregation, private parties)", "vertical",
          "flower_vfl.strategies.vertical_admm:VerticalADMMStrategy",
          "flower_vfl.clients.vertical_party:VerticalPartyClient", "flower_vfl.estimator.engine:VerticalADMM",
          ("query.identify", "train", "evaluate", "query.secagg_keys", "query.psi_answer", "query.psi_order",
           "query.save_model", "query.predict")),
    Route("stacked-ssp", "every party private: one SSP release each, stacked by the label owner", "vertical",
          "flower_vfl.strategies.stacked_ssp:StackedSSPStrategy", "flower_vfl.clients.party_ssp:SSPPartyClient",
          "flower_vfl.estimator.stacked:StackedPrivateParties", ("query.ssp_identify", "query.ssp_release")),
    Route("moment", "every party private: one label-moment release each, then ADMM sharing on the pool", "vertical",
          "flower_vfl.strategies.moment:MomentStrategy", "flower_vfl.clients.party_moment:MomentPartyClient",
          "flower_vfl.estimator.moment_route:MomentMatchingLogistic",
          ("query.moment_identify", "query.moment_release", "train.moment", "evaluate.moment")),
    Route("horizontal-dpiadmm", "horizontal DP inexact ADMM (agents hold different samples)", "horizontal",
          "flower_vfl.strategies.dpiadmm:DPIADMMStrategy", "flower_vfl.clients.dpiadmm:DPIADMMClient",
          "flower_vfl.horizontal.engine:run_dpiadmm", ("query.identify", "train")),
    VERTICAL_SGD,
)


def _check(found) -> dict[str, Route]:
    out: dict[str, Route] = {}
    claimed: dict[tuple, str] = {}
    for r in found:
        if r.name in out:
            raise ValueError(f"two routes are named {r.name!r}")
        for m in r.messages:
            if r.app is not None and (r.app, m) in claimed:
                raise ValueError(f"routes {claimed[r.app, m]!r} and {r.name!r} of the {r.app} app both claim the "
                                 f"message type {m!r}")
            claimed[r.app, m] = r.name
        out[r.name] = r
    return out


_ROUTES = _check(REGISTRY)


def routes() -> dict[str, Route]:
    """Every registered route, by name."""
    return dict(_ROUTES)


def get(name: str) -> Route:
    """The route ``name``, or a ``KeyError`` naming the registered ones."""
    found = routes()
    if name not in found:
        raise KeyError(f"no route {name!r}; the registered routes are {', '.join(sorted(found))}")
    return found[name]


def for_app(app: str) -> list[Route]:
    """The routes the ServerApp/ClientApp pair ``app`` serves, in registry order."""
    return [r for r in routes().values() if r.app == app]


def register(client_app, message_type: str, handler: Callable) -> None:
    """Register ``handler`` on the Flower ``ClientApp`` for ``message_type`` ("train", "evaluate",
    "query.identify", "train.moment": Flower's ``<kind>.<action>``)."""
    kind, _, action = message_type.partition(".")
    if kind not in ("train", "evaluate", "query"):
        raise ValueError(f"message type {message_type!r}: a ClientApp answers train, evaluate or query messages")
    getattr(client_app, kind)(action or "default")(handler)


def client_app(name: str):
    """A Flower ``ClientApp`` answering route ``name``'s messages with its own handlers (each through
    ``flower_vfl.errors.reply_user_errors``: a refusal is one line and an error reply)."""
    from flwr.clientapp import ClientApp

    from flower_vfl.errors import reply_user_errors
    route = get(name)
    if route.handlers is None:
        raise ValueError(f"route {name!r} is served by the {route.app} app, not by handlers of its own")
    handlers = route.load("handlers")
    app = ClientApp()
    for m in route.messages:
        register(app, m, reply_user_errors(handlers[m]))
    return app
