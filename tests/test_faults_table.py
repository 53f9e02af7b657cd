"""Issue 23.6: the rows of docs/deployment.md's fault table that no other test showed.

Every other row names its test in the table (tests/test_strategy_faults.py, tests/test_resume.py,
the slow loopback tests). All in process: the real ServerApp / strategy and the real ClientApp
handlers over tests/test_strategy_faults.py's FaultyGrid, a fresh Context per node and run;
the silent party runs over a push/pull grid with the real clock (round-timeout is a wait).

- a party rejoining mid-run on other data (a new node id, or the same id with its registered
  key): refused by name, before its release touches z; a party that declares a data
  fingerprint and comes back with another: refused by name;
- a node that fails on the same request again and again: stopped after MAX_LOSSES tries, with
  what the user sees (report.json, checkpoint);
- a silent party: round-timeout, then party-wait, then stopped by name;
- a node claiming a party outside 0..num-parties-1: refused at identify.
"""

import json
import time

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.io.checkpoint import load_checkpoint
from flower_vfl.strategies.checkpointing import ResumeRefused
from flower_vfl.strategies.exchange import MAX_LOSSES, PartyFailed, PartyLost, ReplyError
from tests.test_strategy_faults import RC, FaultyGrid, nodes, round_of


def strategy(**kw):
    return sa.make_strategy({**RC, **kw})


@pytest.fixture(scope="module")
def clean():
    st = strategy()
    st.start(FaultyGrid(nodes(), RC))
    return st


@pytest.fixture(scope="module")
def after4():
    """The clean run's central state after round 4 (what a refusal in round 5 must leave)."""
    st = strategy(**{"max-rounds": 4})
    st.start(FaultyGrid(nodes(), RC))
    return st


# ------------------------------------------------------------------ a rejoin with other data
@pytest.fixture
def permuted_after_restart(monkeypatch):
    """Party 1's data, row-permuted, for every load after ``flag['on']`` is set (a SuperNode
    restarted on other data: the same row count, another row order)."""
    real, flag = ca.cached_party_block, {"on": False}

    def load(dataset, party, *a, **kw):
        D, D_test = real(dataset, party, *a, **kw)
        if party == 1 and flag["on"]:
            D = D[np.random.default_rng(0).permutation(D.shape[0])]
        return D, D_test
    monkeypatch.setattr(ca, "cached_party_block", load)
    return flag


@pytest.mark.parametrize("same_id", [False, True], ids=["new node id", "same node id (registered key)"])
def test_a_party_rejoining_mid_run_on_other_data_is_refused_before_its_release_counts(
        same_id, permuted_after_restart, after4, tmp_path):
    """Party 1's SuperNode dies in round 5 and comes back on row-permuted data (before the fix:
    accepted, a model 12.6 away in decision values). It is first sent its round 4 again: its
    release differs from the one the central node holds, so the run stops naming the party; z
    and y are round 4's, the checkpoint is round 4's."""
    def fault(msg, grid):
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101 and 201 not in grid.contexts \
                and grid.sessions[101] == 1:
            permuted_after_restart["on"] = True
            if same_id:
                grid.restart_same_id(101, offline_for=2)
            else:
                grid.restart(101, 201)
            return "dead"
        return None

    state = tmp_path / "state"
    st = strategy(**{"party-wait": 5.0, "state-dir": str(state)})
    node = 101 if same_id else 201
    with pytest.raises(ResumeRefused) as err:
        st.start(FaultyGrid(nodes(), RC, fault))
    msg = str(err.value)
    assert msg.startswith(f"party 1 (node {node}) was sent round 4 again to restore its state and released another "
                          "s_m than in that round (max |difference| ")
    assert msg.endswith(" over 426 rows): its data or its settings changed (rows, row order, columns, lam, penalty, "
                        "x-solver). Give the party its original data and node config, or start a new run without "
                        "resume")
    assert st.failed_ and len(st.history_) == 4
    assert np.array_equal(st.central.z, after4.central.z) and np.array_equal(st.central.y, after4.central.y)
    assert load_checkpoint(state)[1]["round"] == 4


def test_a_party_rejoining_on_its_own_data_is_first_re_synchronized_then_bitwise(clean):
    """The counterpart: the same restart on the same data (new node id) -- round 4 again, then
    round 5 -- ends bitwise equal to the uninterrupted run (the re-synchronization is checked,
    not folded into round 5 unchecked)."""
    sent = []

    def fault(msg, grid):
        if msg.metadata.message_type == "train":
            sent.append((round_of(msg), msg.metadata.dst_node_id))
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101:
            grid.restart(101, 201)
            return "dead"
        return None

    st = strategy(**{"party-wait": 5.0})
    st.start(FaultyGrid(nodes(), RC, fault))
    assert [s for s in sent if s[1] != 100][3:7] == [(4, 101), (5, 101), (4, 201), (5, 201)]
    assert np.array_equal(st.decision_test_, clean.decision_test_)
    assert np.array_equal(st.central.z, clean.central.z) and np.array_equal(st.central.y, clean.central.y)


def test_a_party_declaring_other_data_when_it_rejoins_is_refused_by_name():
    """A party that declares a data fingerprint at identify (the PSI-aligned party does) and,
    restarted, declares another: refused naming both, before it is sent anything."""
    def fault(msg, grid):
        if msg.metadata.message_type == "query.identify" and msg.metadata.dst_node_id in (101, 201):
            fp = "a" * 64 if msg.metadata.dst_node_id == 101 else "b" * 64
            return lambda rep: (rep.content["identity"].__setitem__("data_fingerprint", fp), [rep])[1]
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101:
            grid.restart(101, 201)
            return "dead"
        return None

    st = strategy(**{"party-wait": 5.0})
    with pytest.raises(ResumeRefused) as err:
        st.start(FaultyGrid(nodes(), RC, fault))
    assert str(err.value) == (
        "party 1 came back with other data than it declared at identify: "
        f"{{'n_rows': 426, 'n_test': 143, 'data_fingerprint': '{'b' * 64}'}} now, "
        f"{{'n_rows': 426, 'n_test': 143, 'data_fingerprint': '{'a' * 64}'}} before; give it its original data")
    assert st.failed_ and len(st.history_) == 4


# ------------------------------------------------------------------ MAX_LOSSES
@pytest.mark.parametrize("same_id", [False, True], ids=["new node id", "same node id (registered key)"])
def test_a_node_that_dies_on_one_request_every_time_stops_the_run_after_max_losses(same_id, tmp_path):
    """Party 1's SuperNode dies on round 3's request every time it is asked (a crash loop: each
    time it restarts and rejoins). The run stops on the 6th loss, not after an endless loop; the
    user sees a failed ServerApp, report.json with the reason and rounds 1-2, the checkpoint of
    round 2 (resume gives the uninterrupted run: tests/test_strategy_faults.py)."""
    restarts = []

    def fault(msg, grid):
        if round_of(msg) == 3 and msg.metadata.dst_node_id in (101, *range(201, 220)):
            nid = msg.metadata.dst_node_id
            if same_id:
                grid.restart_same_id(nid)
                new = nid
            else:
                new = 201 + len(restarts)
                grid.restart(nid, new)
            restarts.append(new)
            return "dead"
        return None

    out = tmp_path / "out"
    rc = {**RC, "party-wait": 5.0, "out-dir": str(out)}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(PartyLost) as err:
        sa.main(FaultyGrid(nodes(), rc, fault), ctx)
    assert MAX_LOSSES == 5 and len(restarts) == MAX_LOSSES + 1
    last = ("node 101 restarted (its SuperNode came back with the same key: a new session since it was identified); "
            "its reply, if any, is not used") if same_id else "node 205 is gone (Flower error 5: node unavailable)"
    assert str(err.value) == (f"party 1 was lost 6 times on round 3 (train) (last: {last}): its SuperNode keeps "
                              "failing on this request; see its log")
    report = json.loads((out / "report.json").read_text())
    assert report["final"]["failed"] is True
    assert "party 1 was lost 6 times on round 3 (train)" in report["final"]["error"]
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert load_checkpoint(out / "state")[1]["round"] == 2


# ------------------------------------------------------------------ a silent party: round-timeout
class PushPullGrid(FaultyGrid):
    """FaultyGrid behind push/pull, as a SuperLink is: the exchange's own loop pulls on the real
    clock until the replies came or round-timeout passed. 'drop' = the party takes the message
    and never answers."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.replies: dict[str, list] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            got = FaultyGrid.send_and_receive(self, [msg])
            self.replies[msg.object_id] = got
            ids.append(msg.object_id)
        return ids

    def pull_messages(self, message_ids):
        return [r for i in list(message_ids) for r in self.replies.pop(i, [])]


def test_a_silent_party_is_waited_for_round_timeout_then_party_wait_then_named():
    """Party 1 takes round 3's message and never answers, and no node comes back: the strategy
    waits round-timeout (1.5 s), then party-wait (1 s), then stops naming the party and the node."""
    def fault(msg, grid):
        return "drop" if round_of(msg) == 3 and msg.metadata.dst_node_id == 101 else None

    st = strategy(**{"round-timeout": 1.5, "party-wait": 1.0})
    t0 = time.monotonic()
    with pytest.raises(PartyLost) as err:
        st.start(PushPullGrid(nodes(), RC, fault))
    elapsed = time.monotonic() - t0
    assert str(err.value) == "party 1 did not come back within party-wait=1 s (no reply from node 101)"
    assert 2.5 <= elapsed < 30 and len(st.history_) == 2 and st.failed_


def test_a_slow_party_within_round_timeout_is_waited_for_and_the_run_is_clean(clean):
    """The same grid, every reply on time: the push/pull path gives the clean run bitwise (the
    timeout above is the only difference)."""
    st = strategy(**{"round-timeout": 1.5})
    st.start(PushPullGrid(nodes(), RC))
    assert np.array_equal(st.decision_test_, clean.decision_test_)


# ------------------------------------------------------------------ a claim out of range
def test_a_node_claiming_a_party_outside_num_parties_is_refused_at_identify():
    """A SuperNode whose node config says partition-id=7 in a 2-party run refuses itself (its
    handler's error reaches the central node); a reply claiming party 7 anyway (a faulty or
    hostile party) is refused by the central node. Both before any round, naming the fix."""
    cfg = nodes()
    cfg[101] = {"partition-id": 7}
    with pytest.raises(PartyFailed) as err:
        strategy().start(FaultyGrid(cfg, RC))
    assert str(err.value) == ("node 101 failed in the identify query: ConfigError: node config key 'partition-id'=7 "
                              "is out of range: expected an integer between 0 and 1 (num-parties=2)")

    def fault(msg, grid):
        if msg.metadata.message_type == "query.identify" and msg.metadata.dst_node_id == 101:
            return lambda rep: (rep.content["identity"].__setitem__("party", 7), [rep])[1]
        return None
    st = strategy()
    with pytest.raises(ReplyError) as err:
        st.start(FaultyGrid(nodes(), RC, fault))
    assert str(err.value) == "node 101 claims party 7, outside 0..1 (num-parties=2); fix its partition-id"
    assert st.history_ == []
