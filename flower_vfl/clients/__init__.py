"""Flower party clients: ``from flower_vfl.clients import VerticalPartyClient``."""
from .vertical_party import VerticalPartyClient

__all__ = ["VerticalPartyClient"]
