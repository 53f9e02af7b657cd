"""Flower ClientApp: one vertical party per SuperNode.

Node config: ``partition-id`` (the party), ``num-partitions``, ``data-dir``, and
optionally the party's own privacy budget (``dp-epsilon`` ...), which wins over the run
config.
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from .clients.vertical_party import VerticalPartyClient
from .config import privacy_from_config, run_setting
from .data import party_block

app = ClientApp()


def make_client(context: Context) -> VerticalPartyClient:
    rc, nc = context.run_config, context.node_config
    party = int(nc.get("partition-id", 0))
    num_parties = int(run_setting("num-parties", rc, nc))
    D, D_test = party_block(str(run_setting("dataset", rc, nc)), party, num_parties,
                            run_setting("data-dir", rc, nc) or None)
    return VerticalPartyClient(party, D, D_test, penalty=str(run_setting("penalty", rc, nc)),
                               lam=float(run_setting("lam", rc, nc)),
                               privacy=privacy_from_config(party, rc, nc), n_parties=num_parties)


@app.query("identify")
def identify(msg: Message, context: Context) -> Message:
    return make_client(context).identify(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return make_client(context).train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return make_client(context).evaluate(msg, context)
