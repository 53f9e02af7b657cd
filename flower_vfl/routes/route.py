"""A route's entry in the registry (:mod:`flower_vfl.routes`)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

__all__ = ["Route"]


@dataclass(frozen=True)
class Route:
    """One route of the registry. Its pieces are named ``"module:attribute"`` and imported on use
    (:meth:`load`): a party's process imports no central node, a ServerApp no party, and
    neither the in-process references (``tests/test_architecture.py`` checks every name resolves
    and stays within the layers)."""

    #: its name (for ``app="vertical"``: the run config's ``route`` value)
    name: str
    summary: str
    #: the ServerApp/ClientApp pair that serves it: "vertical" (pyproject's components), "horizontal"
    #: (``flower_vfl.apps.horizontal``), or None (a library route: :func:`client_app`, or in process)
    app: str | None
    #: the central node: a ``flwr.serverapp.strategy.Strategy`` subclass
    central: str
    #: the party's class
    party: str
    #: the in-process reference running the same math (no Flower)
    reference: str
    #: the Flower message types the central node sends and the party answers
    messages: tuple[str, ...]
    #: its own ClientApp handlers (message type -> ``fn(msg, context) -> Message``), for a route
    #: folder; None: its app's handlers serve ``messages``
    handlers: str | None = None
    #: for a route of the "vertical" app that brings its own: ``build(cfg, y, y_test, ids) -> Strategy``
    #: from the checked run config (None: the app's builder, ``apps/server.py``'s ``STRATEGIES``)
    build: str | None = None

    def load(self, piece: str):
        """The object named by ``piece`` ("central", "party", "reference" or "handlers"), imported."""
        ref = getattr(self, piece)
        if ref is None:
            raise ValueError(f"route {self.name!r} has no {piece} of its own")
        module, _, attr = ref.partition(":")
        return getattr(import_module(module), attr)
