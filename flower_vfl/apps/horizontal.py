"""ServerApp / ClientApp pair for horizontal DP inexact ADMM on Fashion-MNIST.

Not the project's default app (pyproject's components stay the vertical ones). Use it
from your own Flower app (``serverapp = "flower_vfl.apps.horizontal:server"``,
``clientapp = "flower_vfl.apps.horizontal:client"``) or from Python.

Run config (public, the server's): ``hz-variant`` (objt|objp|outp), ``hz-iterations``,
``hz-num-agents``, ``hz-split`` (iid|dirichlet), ``hz-dirichlet-alpha``, ``hz-a``,
``hz-beta``, ``hz-trust``, ``hz-eval-every``, ``out-dir``.
Node config (the agent's own): ``partition-id``, ``data-dir``, ``state-dir`` and the
privacy keys ``dp-eps-bar``, ``dp-delta-bar``, ``dp-sensitivity``, ``dp-x-l1-max``,
``dp-seed``, ``dp-max-epsilon``, ``dp-delta`` (see :mod:`flower_vfl.clients.dpiadmm`).
Each agent loads only its own partition (flwr-datasets partitioners by ``partition-id``).
"""

from __future__ import annotations

import json
from logging import INFO
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from flower_vfl.clients.dpiadmm import DPIADMMClient, agent_privacy_from_node_config
from flower_vfl.errors import install_log_filter, reply_user_errors
from flower_vfl.strategies.dpiadmm import DPIADMMStrategy

__all__ = ["server", "client", "make_agent", "make_server_strategy"]

DEFAULTS = {"hz-variant": "objt", "hz-iterations": 100, "hz-num-agents": 10, "hz-split": "iid",
            "hz-dirichlet-alpha": 0.5, "hz-a": 1.0, "hz-beta": 1e-6, "hz-trust": "paper", "hz-eval-every": 10,
            "out-dir": ""}

server = ServerApp()
client = ClientApp()
install_log_filter()     # our user-facing errors: one line, no traceback (flower_vfl.errors)


def _get(key, run_config):
    return run_config.get(key, DEFAULTS[key])


def make_agent(context: Context) -> DPIADMMClient:
    """The agent of this node: its own partition and its own privacy settings (node config)."""
    from flower_vfl.datasets import load_fashion_mnist
    from flower_vfl.horizontal.data import agent_partition
    rc, nc = context.run_config, context.node_config
    X, y, _, _ = load_fashion_mnist(nc.get("data-dir") or None)
    pid, num = int(nc.get("partition-id", 0)), int(_get("hz-num-agents", rc))
    Xp, yp = agent_partition(X, y, pid, num, str(_get("hz-split", rc)), float(_get("hz-dirichlet-alpha", rc)))
    privacy = agent_privacy_from_node_config(nc)
    store = None
    if privacy["eps_bar"] is not None:
        from flower_vfl.privacy.store import PartyStore, default_state_dir
        store = PartyStore(nc.get("state-dir") or default_state_dir())
    return DPIADMMClient(pid, Xp, yp, 10, privacy, store=store)


def identify(msg: Message, context: Context) -> Message:
    return make_agent(context).identify(msg, context)


def train(msg: Message, context: Context) -> Message:
    return make_agent(context).train(msg, context)


# registered through reply_user_errors (flower_vfl.errors): a refusal or a data error is one line
# on the agent's node and an error reply naming it; called directly, the handlers raise
client.query("identify")(reply_user_errors(identify))
client.train()(reply_user_errors(train))


def make_server_strategy(run_config) -> DPIADMMStrategy:
    from flower_vfl.datasets import load_fashion_mnist
    _, _, Xt, yt = load_fashion_mnist(run_config.get("data-dir") or None)
    g = lambda k: _get(k, run_config)  # noqa: E731
    return DPIADMMStrategy(str(g("hz-variant")), int(g("hz-num-agents")), Xt.shape[1], 10, int(g("hz-iterations")),
                           a=float(g("hz-a")), beta=float(g("hz-beta")), trust=str(g("hz-trust")),
                           X_test=Xt, y_test=yt, eval_every=int(g("hz-eval-every")))


@server.main()
def main(grid: Grid, context: Context) -> None:
    st = make_server_strategy(context.run_config).start(
        grid, progress=lambda t, row: log(INFO, "round %d: %s", t, row) if "test_error" in row else None)
    for agent, rep in sorted(st.privacy_.items()):
        tot = rep.get("totals")
        if tot:   # the agent's own ledger, accounted by the agent
            log(INFO, "agent %s: per-iteration eps_bar=%s (the paper's guarantee); this run's total over %d "
                "iterations: PLD eps=%.4g at delta=%g, basic composition %.4g", agent, rep["eps_bar"],
                tot["releases"], tot["epsilon_pld"], tot["delta"], tot["epsilon_basic"])
    out = str(_get("out-dir", context.run_config))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        import numpy as np
        np.save(Path(out) / "w.npy", st.w)
        (Path(out) / "report.json").write_text(json.dumps(
            {"run_config": dict(context.run_config), "history": st.history_, "final": st.final_,
             "privacy_per_agent": st.privacy_}, indent=1, default=str))
