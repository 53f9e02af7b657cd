"""One party base (flower_vfl/clients/base.py): every route's party is a PartyBase, and the
vertical SGD party, the last one to join it, parses every message through the trust boundary's
readers before any math: a malformed message is refused naming the field, and nothing of the
party's state is touched."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from flower_vfl import routes
from flower_vfl.clients.base import PartyBase
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.privacy.boundary import InvalidMessage
from flower_vfl.routes.vertical_sgd.party import SGD_HANDLERS, STATE
from flower_vfl.routes.vertical_sgd.reference import batch_indices


def test_every_routes_party_is_one_base():
    from flower_vfl.clients.vertical_party import PrivatePartyClient, PublicPartyClient, VerticalPartyClient
    for route in routes.routes().values():
        cls = route.load("party")          # the admm route's is the factory of its two kinds
        for kind in ((PublicPartyClient, PrivatePartyClient) if cls is VerticalPartyClient else (cls,)):
            assert issubclass(kind, PartyBase), (route.name, kind)


N = 426          # breast_cancer's training rows in the bundled split (checked below)
CFG = {"seed": 0, "init_scale": 0.01, "batch_size": 64, "n_rows": N, "epoch": 1, "batch": 0}
PENDING = {"step": 0, "epoch": 1, "batch": 0, "lr": 0.1, "seed": 0, "batch_size": 64}


def _send(cfg=None, pending=None, g=None, kind="train"):
    grid = LocalGrid(SGD_HANDLERS, {100: {"partition-id": 0}}, {"dataset": "breast_cancer", "num-parties": 2})
    ctx = grid.contexts[100]
    content = RecordDict({"config": ConfigRecord(cfg if cfg is not None else CFG)})
    if pending is not None:
        content["pending"] = ConfigRecord(pending)
        content["grad"] = ArrayRecord({"g": Array(g)})
    msg = Message(content, dst_node_id=100, message_type=kind)
    return SGD_HANDLERS[kind], msg, ctx


def test_a_well_formed_sgd_round_is_answered():
    handler, msg, ctx = _send()
    rep = handler(msg, ctx)
    assert rep.content["release"]["s"].numpy().shape == (64,)
    assert ctx.state[STATE]["x"].numpy().shape == (15,)   # breast_cancer's 30 columns over 2 parties


G64 = np.zeros(64)


@pytest.mark.parametrize("cfg, pending, g, text", [
    ({**CFG, "n_rows": N + 1}, None, None,
     f"party 0: the server has {N + 1} rows but this party holds {N}; the parties' samples are not aligned"),
    ({**CFG, "seed": "0"}, None, None,
     "party 0: config['seed']='0' must be an integer in 0..9223372036854775807; refused, nothing charged"),
    ({**CFG, "batch_size": 0}, None, None,
     "party 0: config['batch_size']=0 must be an integer in 1..1000000000000; refused, nothing charged"),
    ({**CFG, "init_scale": float("nan")}, None, None,
     "party 0: config['init_scale']=nan is outside the protocol's range (-inf, inf]; refused, nothing charged"),
    ({k: v for k, v in CFG.items() if k != "epoch"}, None, None, "message field config['epoch'] is missing"),
    ({**CFG, "batch": 9}, None, None,
     "party 0: config['batch']: batch=9 is outside 0..6 for N=426, batch_size=64"),
    (CFG, PENDING, np.zeros(63), "party 0: gradient of shape (63,) for a batch of 64 rows"),
    (CFG, PENDING, np.full(64, np.nan), "party 0: grad['g'] (float64) must be finite float values"),
    (CFG, {**PENDING, "lr": "fast"}, G64, "party 0: config['lr']='fast' is not a number"),
    (CFG, {**PENDING, "step": -1}, G64,
     "party 0: config['step']=-1 must be an integer in 0..1000000000000; refused, nothing charged"),
])
def test_a_malformed_sgd_message_is_refused_naming_the_field_before_any_math(cfg, pending, g, text):
    handler, msg, ctx = _send(cfg, pending, g)
    with pytest.raises(InvalidMessage) as exc:
        handler(msg, ctx)
    assert str(exc.value) == text
    assert STATE not in ctx.state                  # nothing drawn, stepped or kept


def test_the_bundled_split_has_the_rows_the_cases_assume():
    handler, msg, ctx = _send()
    assert batch_indices(N, 64, 1, 6, 0).size == N - 6 * 64
    assert int(handler(msg, ctx).content["release"]["s"].numpy().size) == 64
