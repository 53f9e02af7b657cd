"""Flower strategies (the central node): ``from flower_vfl.strategies import VerticalADMMStrategy``."""
from flower_vfl.strategies.vertical_admm import PartyRefused, VerticalADMMStrategy
from flower_vfl.strategies.dpiadmm import AgentRefused, DPIADMMStrategy  # horizontal DP inexact ADMM

__all__ = ["PartyRefused", "VerticalADMMStrategy", "AgentRefused", "DPIADMMStrategy"]
__all__ += ["VerticalSGDStrategy"]  # FDML-style vertical SGD baseline, loaded on first use (__getattr__ below):
# its route folder's central node imports this package (strategies.base), so importing it first must not
# import it back here
from flower_vfl.strategies.psi_align import AlignResult, PSIAlignment  # own data: the label owner's PSI alignment
__all__ += ["AlignResult", "PSIAlignment"]
from flower_vfl.strategies.stacked_ssp import StackedSSPStrategy  # several private parties: stacked SSP releases
__all__ += ["StackedSSPStrategy"]
from flower_vfl.strategies.moment import MomentStrategy  # several private parties: one moment each, ADMM on the pool
__all__ += ["MomentStrategy"]


def __getattr__(name):
    if name == "VerticalSGDStrategy":
        from flower_vfl.strategies.vertical_sgd import VerticalSGDStrategy
        return VerticalSGDStrategy
    raise AttributeError(f"module 'flower_vfl.strategies' has no attribute {name!r}")
