"""Every central-node path talks to the parties through one exchange
(flower_vfl/strategies/exchange.py): a reply is matched to its request by
reply_to_message_id only. Per path (vertical train and evaluate, SGD baseline, horizontal,
PSI answer and order, own-data save and predict): a reply that comes back from another node
than the one asked is refused naming the party and both nodes; an error reply of the SuperLink
(the node is gone) is a lost party, named, once party-wait is over; a reply to an earlier
request is never used."""

import numpy as np
import pytest
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode

from _own_data_helpers import HANDLERS as OWN_HANDLERS, node_configs, run_config, write_a9a_files
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.clients.vertical_sgd import SGD_HANDLERS
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import labels, load_all
from flower_vfl.strategies import DPIADMMStrategy, VerticalSGDStrategy, own_data
from flower_vfl.strategies.exchange import Exchange, PartyLost, ReplyError

VFL_HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
BC = {"dataset": "breast_cancer", "num-parties": 2, "party-wait": 0.0}


class Tamper(LocalGrid):
    """Delivers as LocalGrid; the first message of ``message_type`` to node 101 gets the fault:
    'wrong node' (its reply claims node 100 as sender), 'dead' (the SuperLink's NODE_UNAVAILABLE
    error reply instead of a delivery), 'drop' (no reply at all)."""

    def __init__(self, handlers, nodes, rc, message_type, fault):
        super().__init__(handlers, nodes, rc)
        self.message_type, self.fault, self.done = message_type, fault, False

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            hit = (not self.done and msg.metadata.message_type == self.message_type
                   and msg.metadata.dst_node_id == 101)
            if not hit:
                out.extend(super().send_and_receive([msg], timeout=timeout))
                continue
            self.done = True
            msg.metadata.__dict__["_message_id"] = msg.object_id
            if self.fault == "dead":
                out.append(Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable"), reply_to=msg))
            elif self.fault == "wrong node":
                rep, = super().send_and_receive([msg], timeout=timeout)
                rep.metadata.__dict__["_src_node_id"] = 100
                out.append(rep)
        return out


# ------------------------------------------------------------------ the paths
def vertical(message_type, fault):
    rc = dict(BC, **{"max-rounds": 3})
    sa.make_strategy(rc).start(Tamper(VFL_HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc,
                                      message_type, fault))


def sgd(message_type, fault):
    y, yt = labels("breast_cancer")
    grid = Tamper(SGD_HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}},
                  {"dataset": "breast_cancer", "num-parties": 2}, message_type, fault)
    VerticalSGDStrategy(y, yt, num_parties=2, batch_size=200, max_epochs=1).start(grid)


def horizontal(message_type, fault):
    from sklearn.datasets import load_digits

    from flower_vfl.clients import DPIADMMClient
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    from flower_vfl.horizontal.data import split_arrays
    X, y = load_digits(return_X_y=True)
    keep = y < 3
    Xp, yp = split_arrays(X[keep][:200] / 16.0, y[keep][:200], 2, "iid")

    def client(ctx):
        pid = int(ctx.node_config["partition-id"])
        return DPIADMMClient(pid, Xp[pid], yp[pid], 3, agent_privacy_from_node_config({}))
    handlers = {"train": lambda m, c: client(c).train(m, c), "query.identify": lambda m, c: client(c).identify(m, c)}
    DPIADMMStrategy("objt", 2, X.shape[1], 3, 2).start(
        Tamper(handlers, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, {}, message_type, fault))


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Files for a 2-party own-data run, and a trained model on the parties' disks."""
    tmp = tmp_path_factory.mktemp("own")
    X, y, Xt, _ = load_all("a9a")
    train, score = write_a9a_files(tmp, X[:300], y[:300], Xt[:100], n_extra=5)
    nodes = node_configs(train, score, "csv", tmp)
    rc = run_config(train, score, tmp, **{"max-rounds": 2, "party-wait": 0.0})
    own_data.train(LocalGrid(OWN_HANDLERS, nodes, rc), rc, sa.make_strategy)
    return nodes, rc


def own_train(own, message_type, fault):
    nodes, rc = own
    own_data.train(Tamper(OWN_HANDLERS, nodes, rc, message_type, fault), rc, sa.make_strategy)


def own_predict(own, message_type, fault):
    nodes, rc = own
    rc = dict(rc, mode="predict")
    own_data.predict(Tamper(OWN_HANDLERS, nodes, rc, message_type, fault), rc)


PATHS = {
    "vertical train": (vertical, "train", "round 1 (train)"),
    "vertical evaluate": (vertical, "evaluate", "round 3 (final evaluate)"),
    "sgd": (sgd, "train", "epoch 1 batch 0 (train)"),
    "horizontal": (horizontal, "train", "round 1 (train)"),
    "psi order": (own_train, "query.psi_order", "PSI order (split 'train')"),
    "own-data save": (own_train, "query.save_model", "save model"),
    "own-data predict": (own_predict, "query.predict", "predict"),
}
OWN = {"psi order", "own-data save", "own-data predict"}


def _run(path, fault, request):
    fn, message_type, _ = PATHS[path]
    if path in OWN:
        return fn(request.getfixturevalue("own"), message_type, fault)
    return fn(message_type, fault)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_reply_from_another_node_is_refused_naming_both_nodes(path, request):
    role = "agent" if path == "horizontal" else "party"
    what = PATHS[path][2]
    with pytest.raises(ReplyError, match=rf"^{role} 1: the reply to the {_re(what)} request came from node 100, "
                                         rf"not from node 101 that serves {role} 1$"):
        _run(path, "wrong node", request)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_superlink_error_reply_is_a_lost_party_named_after_party_wait(path, request):
    role = "agent" if path == "horizontal" else "party"
    with pytest.raises(PartyLost, match=rf"^{role} 1 did not come back within party-wait=0 s \(node 101 is gone "
                                        r"\(Flower error 5: node unavailable\)\)$"):
        _run(path, "dead", request)


def test_a_lost_save_acknowledgement_is_an_error(own):
    with pytest.raises(PartyLost, match=r"^party 1 did not come back within party-wait=0 s \(no reply from node 101\)$"):
        own_train(own, "query.save_model", "drop")


@pytest.mark.parametrize("path, message_type", [("vertical", "query.identify"), ("sgd", "query.identify"),
                                                ("horizontal", "query.identify"), ("psi", "query.psi_answer")])
def test_identify_steps_match_by_request_and_name_the_node(path, message_type, request):
    """The identify step of every path (the PSI answer step identifies the parties of an own-data
    run): a reply from another node is refused; a node the SuperLink reports gone is missing."""
    run = {"vertical": vertical, "sgd": sgd, "horizontal": horizontal}.get(path)
    call = (lambda f: own_train(request.getfixturevalue("own"), message_type, f)) if run is None else \
        (lambda f: run(message_type, f))
    what = "the PSI answer step for split 'train'" if path == "psi" else "the identify query"
    with pytest.raises(ReplyError, match=rf"^the reply to {_re(what)} sent to node 101 came from node 100$"):
        call("wrong node")
    roles = "agents" if path == "horizontal" else "parties"
    seen = "100, 101, 102" if path == "psi" else "100, 101"
    with pytest.raises(PartyLost, match=rf"^{roles} \[1\] did not answer {_re(what)} within party-wait=0 s "
                                        rf"\(nodes seen: \[{seen}\]\)"):
        call("dead")


def test_exchange_ignores_late_replies_and_refuses_a_second_one():
    """Exchange on its own: a reply to a request of an earlier exchange is never used; two replies
    to one request stop the run; party_of maps a reply to its party by reply_to_message_id."""
    rc = dict(BC)
    grid = LocalGrid(VFL_HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    ex = Exchange(grid, 2)
    ex.identify("query.identify", _identify_content(), lambda nid, rep: (
        int(rep.content["identity"]["party"]), None))
    assert ex.node_to_party == {100: 0, 101: 1}
    eval_content = lambda p, nid: _eval_content()  # noqa: E731
    first = ex.send(eval_content, "evaluate", [0, 1], "probe")
    assert {p: ex.party_of(r) for p, r in first.items()} == {0: 0, 1: 1}
    old = first[1]
    real = grid.send_and_receive

    def with_late(messages, *, timeout=None):
        return [old] + list(real(messages, timeout=timeout))
    grid.send_and_receive = with_late
    again = ex.send(eval_content, "evaluate", [0, 1], "probe")
    assert again[1] is not old and np.array_equal(again[1].content["release"]["s_test"].numpy(),
                                                  old.content["release"]["s_test"].numpy())
    with pytest.raises(ReplyError, match=r"which the last exchange did not send$"):
        ex.party_of(old)

    def twice(messages, *, timeout=None):
        out = list(real(messages, timeout=timeout))
        return out + out[-1:]
    grid.send_and_receive = twice
    with pytest.raises(ReplyError, match=r"^party 1 \(node 101\): a second reply to the probe request; one reply "
                                         r"per party is accepted$"):
        ex.send(eval_content, "evaluate", [0, 1], "probe")


def _identify_content():
    from flwr.app import ConfigRecord, RecordDict
    return RecordDict({"config": ConfigRecord({"want": "party"})})


def _eval_content():
    from flwr.app import ConfigRecord, RecordDict
    return RecordDict({"config": ConfigRecord({"round": 1, "rho": 1e-3, "alpha": 1.0, "theta": 0.5,
                                               "n_outputs": 1})})


def _re(text):
    import re
    return re.escape(text)


class _PullGrid:
    """A grid with push/pull whose replies come on the ``ready``-th pull."""

    def __init__(self, ready):
        self.ready, self.pulls = ready, 0

    def push_messages(self, messages):
        return [f"id{i}" for i in range(len(list(messages)))]

    def pull_messages(self, ids):
        self.pulls += 1
        if self.pulls < self.ready:
            return []
        from types import SimpleNamespace
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in sorted(ids)]


class InMemoryGrid(_PullGrid):
    """Named as Flower's simulation grid (the schedule is chosen by the class name)."""


@pytest.mark.parametrize("grid_cls, first, cap", [
    (_PullGrid, "PULL_FIRST_S", "PULL_MAX_S"), (InMemoryGrid, "PULL_FIRST_LOCAL_S", "PULL_MAX_LOCAL_S")])
def test_send_and_receive_pull_schedule(grid_cls, first, cap, monkeypatch, tmp_path):
    """Pulls from ``first`` seconds apart, x1.5, capped; Flower's simulation grid (a look-up in
    its own process) is pulled every 2-10 ms, a remote one every 10-100 ms. With
    $FLOWER_VFL_TIMING one JSON line of stamps per exchange is appended."""
    import json

    from flower_vfl.strategies import exchange

    first, cap = getattr(exchange, first), getattr(exchange, cap)
    monkeypatch.setenv("FLOWER_VFL_SIM_WAKE", "0")     # no simulation engine here (tests/test_sim_delivery.py)
    slept = []
    monkeypatch.setattr(exchange.time, "sleep", slept.append)
    monkeypatch.setenv("FLOWER_VFL_TIMING", str(tmp_path / "t.jsonl"))
    grid = grid_cls(ready=10)
    msgs = ["message to node 1", "message to node 2"]           # the grid only counts them
    replies = exchange.send_and_receive(grid, msgs, timeout=60)
    assert len(replies) == 2 and grid.pulls == 10
    want, w = [], first
    for _ in range(9):
        want.append(w)
        w = min(w * 1.5, cap)
    assert slept == pytest.approx(want) and max(slept) == cap
    line, = (tmp_path / "t.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert (rec["who"], rec["messages"], rec["replies"], rec["pulls"]) == ("server", 2, 2, 10)
    assert rec["t_push"] <= rec["t_pushed"] <= rec["t_pull_last0"] <= rec["t_done"]   # the last pull began


def test_replies_that_came_during_a_pull_past_the_deadline_are_taken(monkeypatch):
    """A pull that outlasts the exchange's timeout (Flower retries a reply whose objects a killed
    SuperNode never finished uploading, until the SuperLink gives up) returns only that reply's
    error; the other party's reply, stored meanwhile, is taken by one more pull instead of the
    party being counted lost (CI, test_supernode_killed_and_restarted_gives_the_same_result: party
    0 answered, was reported 'no reply' and never 'came back')."""
    from types import SimpleNamespace

    from flower_vfl.strategies import exchange

    clock = {"t": 0.0}
    monkeypatch.setattr(exchange.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(exchange.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    reply = lambda i: SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))  # noqa: E731

    class Blocking:
        pulls = []

        def push_messages(self, messages):
            return ["id0", "id1"]

        def pull_messages(self, ids):
            self.pulls.append(sorted(ids))
            if len(self.pulls) == 1:
                clock["t"] += 200.0           # blocked on id1's missing objects, past the timeout
                return [reply("id1")]         # its error reply; id0's reply came meanwhile
            return [reply(i) for i in sorted(ids) if i == "id0"]

    grid = Blocking()
    replies = exchange.send_and_receive(grid, ["to node 0", "to node 1"], timeout=90)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["id0", "id1"]
    assert grid.pulls == [["id0", "id1"], ["id0"]]

    class Silent(Blocking):
        pulls = []

        def pull_messages(self, ids):
            self.pulls.append(sorted(ids))
            clock["t"] += 200.0 if len(self.pulls) == 1 else 0.0
            return [reply("id1")] if len(self.pulls) == 1 else []

    clock["t"] = 0.0
    grid = Silent()
    replies = exchange.send_and_receive(grid, ["to node 0", "to node 1"], timeout=90)
    assert [r.metadata.reply_to_message_id for r in replies] == ["id1"]      # one more pull, no more
    assert grid.pulls == [["id0", "id1"], ["id0"]]
