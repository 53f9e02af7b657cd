"""Horizontal DP inexact ADMM (Ryu & Kim): math and the in-process engine, no Flower imports.

``model`` (multiclass logistic regression), ``admm`` (server, agent and dual steps, eq. 4,
8-11, 20, 21 and the OutP baseline), ``privacy`` (the agent's noise draws and dp-accounting
totals), ``engine`` (all agents vectorized), ``data`` (flwr-datasets splits), ``audit``
(sensitivity audit), ``anchors`` (FedAvg and DP-SGD baselines).
"""
from flower_vfl.horizontal.admm import VARIANTS, DPIADMMParams, rho_schedule
from flower_vfl.horizontal.engine import DPIADMMResult, agent_seeds, run_dpiadmm
from flower_vfl.horizontal.privacy import account

__all__ = ["VARIANTS", "DPIADMMParams", "DPIADMMResult", "account", "agent_seeds", "rho_schedule",
           "run_dpiadmm"]
