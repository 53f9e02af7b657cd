"""Flower strategies (the central node): ``from flower_vfl.strategies import VerticalADMMStrategy``."""
from flower_vfl.strategies.vertical_admm import PartyRefused, VerticalADMMStrategy
from flower_vfl.strategies.dpiadmm import AgentRefused, DPIADMMStrategy  # horizontal DP inexact ADMM

__all__ = ["PartyRefused", "VerticalADMMStrategy", "AgentRefused", "DPIADMMStrategy"]
from flower_vfl.strategies.vertical_sgd import VerticalSGDStrategy  # FDML-style vertical SGD baseline
__all__ += ["VerticalSGDStrategy"]
from flower_vfl.strategies.psi_align import AlignResult, PSIAlignment  # own data: the label owner's PSI alignment
__all__ += ["AlignResult", "PSIAlignment"]
from flower_vfl.strategies.stacked_ssp import StackedSSPStrategy  # several private parties: stacked SSP releases
__all__ += ["StackedSSPStrategy"]
from flower_vfl.strategies.moment import MomentStrategy  # several private parties: one moment each, ADMM on the pool
__all__ += ["MomentStrategy"]
