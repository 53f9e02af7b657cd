"""The ADMM sharing math (no Flower imports): losses, penalties, party and central updates."""
from .central import CentralUpdate
from .engine import VerticalADMM, default_rho
from .losses import get_loss
from .party import PartyUpdate
from .penalties import get_penalty

__all__ = ["VerticalADMM", "CentralUpdate", "PartyUpdate", "default_rho", "get_loss", "get_penalty"]
