"""Flower strategies (the central node): ``from flower_vfl.strategies import VerticalADMMStrategy``."""
from .vertical_admm import PartyRefused, VerticalADMMStrategy

__all__ = ["PartyRefused", "VerticalADMMStrategy"]
