"""ServerApp / ClientApp pair for horizontal DP inexact ADMM on Fashion-MNIST.

Not the project's default app (pyproject's components stay the vertical ones). Use it
from your own Flower app (``serverapp = "flower_vfl.apps.horizontal:server"``,
``clientapp = "flower_vfl.apps.horizontal:client"``) or from Python.

Run config (public, the server's): ``hz-variant`` (objt|objp|outp), ``hz-iterations``,
``hz-num-agents``, ``hz-split`` (iid|dirichlet), ``hz-dirichlet-alpha``, ``hz-a``,
``hz-beta``, ``hz-trust``, ``hz-eval-every``, ``out-dir``, ``data-dir``.
Node config (the agent's own): ``partition-id``, ``data-dir``, ``state-dir`` and the
privacy keys ``dp-eps-bar``, ``dp-delta-bar``, ``dp-sensitivity``, ``dp-x-l1-max``,
``dp-max-epsilon`` (required when private), ``dp-delta`` (see :mod:`flower_vfl.clients.dpiadmm`);
a ``dp-seed`` is refused. Both are typed, range-checked and defaulted by
:mod:`flower_vfl.config.schema` (scopes ``hz-run``/``hz-node``); any other key is refused
before any round. Each agent loads only its own partition (flwr-datasets partitioners by
``partition-id``); its ledger is keyed by the data its node config declares
(:func:`flower_vfl.clients.source.agent_source`), so the run config's ``hz-num-agents`` /
``hz-split`` choose which samples it trains on, never a fresh budget.
"""

from __future__ import annotations

import json
import os
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from flower_vfl import routes
from flower_vfl.clients.dpiadmm import DPIADMMClient, agent_privacy_from_node_config
from flower_vfl.clients.source import agent_source
from flower_vfl.config.schema import parse_agent_node_config, parse_horizontal_run_config
from flower_vfl.errors import install_log_filter, reply_user_errors
from flower_vfl.strategies.dpiadmm import DPIADMMConfig, DPIADMMStrategy

__all__ = ["server", "client", "make_agent", "make_server_strategy"]

server = ServerApp()
client = ClientApp()
install_log_filter()     # our user-facing errors: one line, no traceback (flower_vfl.errors)


def make_agent(context: Context) -> DPIADMMClient:
    """The agent of this node: its own partition and its own privacy settings (node config)."""
    from flower_vfl.datasets import FASHION_MNIST_DIR, load_fashion_mnist
    from flower_vfl.horizontal.data import agent_partition
    rc, nc = parse_horizontal_run_config(context.run_config), context.node_config
    own = parse_agent_node_config(nc)
    privacy = agent_privacy_from_node_config(nc)      # before any data is read: dp-seed, dp-max-epsilon
    source = agent_source(nc, FASHION_MNIST_DIR)      # the ledger's key: not hz-num-agents, not hz-split
    X, y, _, _ = load_fashion_mnist(own["data-dir"] or None)
    pid, num = int(own["partition-id"]), rc["hz-num-agents"]
    Xp, yp = agent_partition(X, y, pid, num, rc["hz-split"], rc["hz-dirichlet-alpha"])
    store = None
    if privacy["eps_bar"] is not None:
        from flower_vfl.privacy.store import PartyStore, default_state_dir
        store = PartyStore(own["state-dir"] or default_state_dir())
    return DPIADMMClient(pid, Xp, yp, 10, privacy, store=store, source=source)


#: the ClientApp handlers: the agent ``make_agent(context)`` builds (per message, from its node config)
#: answers (:meth:`~flower_vfl.clients.base.PartyBase.handler`)
identify = DPIADMMClient.handler("identify", make_agent, doc="The agent's identify (flower_vfl.clients.dpiadmm).")
train = DPIADMMClient.handler("train", make_agent, doc="One DP-IADMM round of the agent (flower_vfl.clients.dpiadmm).")


#: message type -> this app's handler, for every message type of the routes it serves
HANDLERS = {"query.identify": identify, "train": train}
# the ClientApp, built from the route registry (flower_vfl.routes: the routes of the "horizontal"
# app); registered through reply_user_errors (flower_vfl.errors): a refusal or a data error is one
# line on the agent's node and an error reply naming it; called directly, the handlers raise
for _route in routes.for_app("horizontal"):
    for _message_type in _route.messages:
        routes.register(client, _message_type, reply_user_errors(HANDLERS[_message_type]))


def make_server_strategy(run_config) -> DPIADMMStrategy:
    from flower_vfl.datasets import load_fashion_mnist
    g = parse_horizontal_run_config(run_config)      # every key checked before any data is read
    _, _, Xt, yt = load_fashion_mnist(g["data-dir"] or None)
    config = DPIADMMConfig.from_run_config(g, num_features=Xt.shape[1], num_classes=10)
    return DPIADMMStrategy(config, X_test=Xt, y_test=yt)


def writable_out_dir(out: str):
    """Make sure ``out-dir`` can take the run's files before any round (a read-only folder, a full
    disk or a plain file there used to end the finished run in a raw OSError, its model unwritten)."""
    from flower_vfl.config.schema import ConfigError
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out-dir {path} is a file, not a folder; {_OUT_FIX}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".flower-vfl-write-probe-{os.getpid()}"
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 65536)          # room for at least a small file
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"out-dir {path} cannot be written ({exc.strerror or exc}); {_OUT_FIX}") from None


_OUT_FIX = "set the run-config key out-dir to a writable folder with free space (it is created if missing)"


@server.main()
def main(grid: Grid, context: Context) -> None:
    out = parse_horizontal_run_config(context.run_config)["out-dir"]
    if out:
        writable_out_dir(out)                  # before any round: the run's output has somewhere to go
    st = make_server_strategy(context.run_config)
    st.progress = lambda t, row: log(INFO, "round %d: %s", t, row) if "test_error" in row else None
    st.start(grid=grid, initial_arrays=ArrayRecord())
    for agent, rep in sorted(st.privacy_.items()):
        tot = rep.get("totals")
        if tot:   # the agent's own ledger, accounted by the agent
            log(INFO, "agent %s: per-iteration eps_bar=%s (the paper's guarantee); this run's total over %d "
                "iterations: PLD eps=%.4g at delta=%g, basic composition %.4g", agent, rep["eps_bar"],
                tot["releases"], tot["epsilon_pld"], tot["delta"], tot["epsilon_basic"])
    if out:
        import numpy as np
        from flower_vfl.config.schema import ConfigError
        try:
            np.save(Path(out) / "w.npy", st.w)
            (Path(out) / "report.json").write_text(json.dumps(
                {"run_config": dict(context.run_config), "history": st.history_, "final": st.final_,
                 "privacy_per_agent": st.privacy_}, indent=1, default=str))
        except OSError as exc:           # the disk filled or went read-only during the run
            raise ConfigError(f"out-dir {out}: the run finished but its files cannot be written "
                              f"({exc.strerror or exc}); {_OUT_FIX}, then run again") from None
