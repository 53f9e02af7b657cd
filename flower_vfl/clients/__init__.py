"""Flower party clients: ``from flower_vfl.clients import VerticalPartyClient``."""
from .vertical_party import VerticalPartyClient
from .dpiadmm import DPIADMMClient  # horizontal DP inexact ADMM agent

__all__ = ["VerticalPartyClient", "DPIADMMClient"]
from .vertical_sgd import VerticalSGDPartyClient  # FDML-style vertical SGD baseline
__all__ += ["VerticalSGDPartyClient"]
