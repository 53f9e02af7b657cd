"""The central node against malformed replies, lost and restarted SuperNodes, stragglers, a
ServerApp crash (checkpoint + resume) and node keys bound to parties, all in process.

A FaultyGrid wraps the in-process LocalGrid: it can rewrite a reply, drop a message (the party
never sees it), answer for a dead node the way the SuperLink does (an error reply), and start a
"restarted SuperNode" (a new node id, the same node config, the party's state as it kept it), or
one restarted with its registered key (the same node id, a new session: the SuperLink's
``NodeInfo.last_activated_at`` changes, ``context.state`` is empty).
"""

import copy
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.proto.node_pb2 import NodeInfo

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.io.checkpoint import load_checkpoint
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.strategies.exchange import PartyFailed, PartyLost, ReplyError, key_fingerprint
from _wire import edit_reply

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
RC = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 8, "party-wait": 0.0}
N = 426


class FaultyGrid(LocalGrid):
    """``fault(msg, grid)`` returns None (deliver normally), 'drop' (never delivered, no reply),
    'dead' (the SuperLink's NODE_UNAVAILABLE error reply), 'error' (the party's handler raised)
    or a function reply -> [replies]."""

    def __init__(self, node_configs, rc, fault=None, keys=None):
        super().__init__(HANDLERS, node_configs, rc)
        self.fault, self.keys, self.dead = fault, keys or {}, set()
        self.sessions = dict.fromkeys(self.contexts, 1)    # node id -> activation count
        self.back: dict[int, int] = {}                      # node id -> node listings until it is back

    def get_node_ids(self):
        for n in list(self.back):
            self.back[n] -= 1
            if self.back[n] <= 0:
                del self.back[n]
                self.dead.discard(n)
        return [n for n in self.contexts if n not in self.dead]

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b""),
                         last_activated_at=f"2026-01-01T00:00:{self.sessions.get(n, 1):02d}")
                for n in self.get_node_ids()]

    def restart_same_id(self, nid, offline_for=0):
        """SuperNode ``nid`` restarts with its registered key: the same node id, a new session, an
        empty ``context.state``; offline (the SuperLink answers NODE_UNAVAILABLE) for the next
        ``offline_for`` node listings first."""
        ctx = self.contexts[nid]
        self.contexts[nid] = Context(run_id=1, node_id=nid, node_config=dict(ctx.node_config), state=RecordDict(),
                                     run_config=dict(ctx.run_config))
        self.sessions[nid] = self.sessions.get(nid, 1) + 1
        if offline_for:
            self.dead.add(nid)
            self.back[nid] = offline_for

    def restart(self, old, new, keep_state=False):
        """The SuperNode ``old`` comes back as ``new``: with an empty ``context.state`` (what a
        restarted SuperNode has), or with the state it kept (``keep_state``)."""
        self.dead.add(old)
        ctx = self.contexts[old]
        self.contexts[new] = Context(run_id=1, node_id=new, node_config=dict(ctx.node_config),
                                     state=copy.deepcopy(ctx.state) if keep_state else RecordDict(),
                                     run_config=dict(ctx.run_config))
        self.sessions[new] = 1

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id
            action = self.fault(msg, self) if self.fault else None
            if msg.metadata.dst_node_id in self.dead or action == "dead":
                out.append(Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable"), reply_to=msg))
                continue
            if action == "drop":
                continue
            if action == "error":     # what Flower sends when the party's handler raised
                out.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="ValueError: bad"),
                                   reply_to=msg))
                continue
            replies = list(super().send_and_receive([msg], timeout=timeout))
            out.extend(action(replies[0]) if callable(action) else replies)
        return out


def nodes(n=2):
    return {100 + i: {"partition-id": i} for i in range(n)}


def run(grid, **rc):
    st = sa.make_strategy({**RC, **rc})
    st.start(grid)
    return st


def round_of(msg):
    return int(msg.content["config"]["round"]) if msg.metadata.message_type == "train" else -1


@pytest.fixture(scope="module")
def clean():
    return run(FaultyGrid(nodes(), RC))


def _with_release(rep, key="s", value=None, dtype=None):
    def edit(content):
        v = content["release"]["s"].numpy() if value is None else value
        content["release"] = ArrayRecord({key: Array(np.asarray(v, dtype=dtype or v.dtype))})
    return [edit_reply(rep, edit)]


def _sender(node):
    def f(rep):
        rep.metadata.__dict__["_src_node_id"] = node
        return [rep]
    return f


MALFORMED = {
    "no release record": (lambda r: [edit_reply(r, lambda c: c.__delitem__("release"))], r"has no 'release' record"),
    "no s": (lambda r: _with_release(r, key="t"), r"release\['s'\] is missing \(keys: \['t'\]\)"),
    "int dtype": (lambda r: _with_release(r, dtype=np.int64), r"release\['s'\] has dtype int64; expected float64"),
    "length 1": (lambda r: _with_release(r, value=np.zeros(1)), r"has shape \(1,\); expected \(426,\)"),
    "2-D": (lambda r: _with_release(r, value=np.zeros((N, 2))), r"has shape \(426, 2\); expected \(426,\)"),
    "NaN": (lambda r: _with_release(r, value=np.full(N, np.nan)), r"holds 426 NaN/inf values; refused"),
    "inf": (lambda r: _with_release(r, value=np.r_[np.inf, np.zeros(N - 1)]), r"holds 1 NaN/inf values"),
    "duplicate": (lambda r: [r, r], r"party 1 \(node 101\): a second reply to the round 3 \(train\) request"),
    "wrong node": (_sender(100), r"party 1: the reply to the round 3 \(train\) request came from node 100, "
                                 r"not from node 101"),
    "handler error": ("error", r"party 1 \(node 101\) failed in the round 3 \(train\) request \(Flower error 2\): ValueError: bad"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_reply_stops_the_run_naming_the_party_and_leaves_z_untouched(case, clean, tmp_path):
    """Round 3's reply of party 1 is malformed: a clear error naming the party and the field,
    z and y stay those of round 2, the checkpoint is round 2's; resuming from it in a new run
    (parties without state: re-synchronized from the checkpoint) gives the clean run (1e-9)."""
    tamper, message = MALFORMED[case]

    def fault(msg, grid):
        if round_of(msg) == 3 and msg.metadata.dst_node_id == 101:
            return tamper
        return None

    state = tmp_path / "state"
    st = sa.make_strategy({**RC, "state-dir": str(state)})
    exc_type = PartyFailed if case == "handler error" else ReplyError
    with pytest.raises(exc_type, match=message):
        st.start(FaultyGrid(nodes(), RC, fault))
    assert st.failed_ and "party 1" in st.stopped_reason_ and len(st.history_) == 2
    arrays, header = load_checkpoint(state)
    assert header["round"] == 2
    ref = sa.make_strategy({**RC, "max-rounds": 2})
    ref.start(FaultyGrid(nodes(), RC))
    assert np.array_equal(st.central.z, ref.central.z) and np.array_equal(st.central.y, ref.central.y)
    # valid exchanges afterwards: a new run resumed from the checkpoint reaches the clean result
    resumed = sa.make_strategy({**RC, "resume": str(state)})
    resumed.start(FaultyGrid(nodes(), RC))
    assert np.max(np.abs(resumed.decision_test_ - clean.decision_test_)) <= 1e-9
    assert resumed.history_[:2] == st.history_


def test_late_reply_to_an_earlier_request_is_never_used(clean):
    """A reply whose reply_to_message_id matches no request of this round (here: the party's
    round-3 reply re-delivered in round 4, from the right node) is ignored; the real reply counts."""
    kept = {}

    def fault(msg, grid):
        if round_of(msg) == 3 and msg.metadata.dst_node_id == 101:
            return lambda rep: (kept.setdefault("old", rep), [rep])[1]
        if round_of(msg) == 4 and msg.metadata.dst_node_id == 101:
            return lambda rep: [kept["old"], rep]
        return None

    st = run(FaultyGrid(nodes(), RC, fault))
    assert np.array_equal(st.decision_test_, clean.decision_test_)


def test_dead_supernode_restarted_with_a_new_node_id_gives_the_same_result(clean):
    """Node 101 dies before round 5 (the SuperLink answers NODE_UNAVAILABLE); the party's
    SuperNode restarts as node 201 with an empty context.state. The strategy matches the error
    reply by reply_to_message_id, waits, re-identifies node 201 as party 1, re-sends round 5
    re-synchronized with the party's last release: the clean run's result (1e-9)."""
    def fault(msg, grid):
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101:
            grid.restart(101, 201)
            return "dead"
        return None

    grid = FaultyGrid(nodes(), RC, fault)
    st = run(grid, **{"party-wait": 5.0})
    assert st.node_to_party == {100: 0, 201: 1}
    assert np.max(np.abs(st.decision_test_ - clean.decision_test_)) <= 1e-9
    assert len(st.history_) == 8


def test_party_that_never_returns_stops_the_server_app_with_a_checkpoint(tmp_path):
    """Node 101 dies at round 4 and no node comes back: the ServerApp raises (the Flower run
    fails: non-zero status) naming party 1, report.json says what was done, the checkpoint is
    round 3's."""
    def fault(msg, grid):
        if round_of(msg) == 4 and msg.metadata.dst_node_id == 101:
            grid.dead.add(101)
        return None

    out = tmp_path / "out"
    rc = {**RC, "party-wait": 0.5, "out-dir": str(out)}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(PartyLost, match=r"party 1 did not come back within party-wait=0.5 s \(node 101 is gone "
                                        r"\(Flower error 5: node unavailable\)\)"):
        sa.main(FaultyGrid(nodes(), rc, fault), ctx)
    import json
    report = json.loads((out / "report.json").read_text())
    assert report["final"]["failed"] is True and "party 1 did not come back" in report["final"]["error"]
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert load_checkpoint(out / "state")[1]["round"] == 3
    assert (out / "metrics.csv").read_text().count("\n") == 4


def test_identify_waits_for_every_party_then_names_the_missing_one():
    grid = FaultyGrid(nodes(), RC)
    grid.dead.add(101)
    with pytest.raises(RuntimeError, match=r"parties \[1\] did not answer the identify query within "
                                           r"party-wait=0.3 s \(nodes seen: \[100\]\)"):
        run(grid, **{"party-wait": 0.3})


def test_crash_and_resume_gives_bitwise_the_same_iterates(clean, tmp_path):
    """The ServerApp dies during round 5 (before any party got it); a new ServerApp with
    resume=<state folder> continues with the parties that kept their state (and say so at
    identify): every iterate and the decision values equal the uninterrupted run's bitwise."""
    class Crash(Exception):
        pass

    def identify_with_state(msg, context):
        """A party that kept its state says so (identity last_train): no re-synchronization."""
        rep = ca.identify(msg, context)
        meta = context.state["vfl.meta"] if "vfl.meta" in context.state else {}
        rep.content["identity"]["last_train"] = int(meta.get("last_train", -1))
        return rep

    def fault(msg, grid):
        if round_of(msg) == 5:
            raise Crash
        return None

    state = tmp_path / "state"
    grid = FaultyGrid(nodes(), RC, fault)
    with pytest.raises(Crash):
        run(grid, **{"state-dir": str(state)})
    grid.fault = None
    grid.handlers = dict(HANDLERS, **{"query.identify": identify_with_state})
    st = run(grid, resume=str(state))
    assert np.array_equal(st.decision_test_, clean.decision_test_)
    assert np.array_equal(st.central.z, clean.central.z) and np.array_equal(st.central.y, clean.central.y)
    assert st.central.b == clean.central.b
    assert [r["primal_residual"] for r in st.history_] == [r["primal_residual"] for r in clean.history_]


def test_resume_refuses_a_different_run(tmp_path):
    state = tmp_path / "state"
    run(FaultyGrid(nodes(), RC), **{"state-dir": str(state), "max-rounds": 2})
    with pytest.raises(ValueError, match=r"the checkpoint was made by another run: num-parties=2 in the checkpoint, "
                                         r"3 in this run\. Resume with the checkpoint's settings"):
        run(FaultyGrid(nodes(3), {**RC, "num-parties": 3}), **{"num-parties": 3, "max-rounds": 2,
                                                                "resume": str(state)})
    with pytest.raises(FileNotFoundError, match=r"resume='.*nowhere': no checkpoint.npz there"):
        run(FaultyGrid(nodes(), RC), resume=str(tmp_path / "nowhere"))


def test_stale_straggler_round_goes_on_and_staleness_is_bounded(clean):
    """stragglers='stale': party 1's round-4 message is lost; round 4 goes on with its last
    release (one stale party logged), and the run heads for the clean run's solution (its gap
    to the clean run's decision values shrinks by more than 30 % from round 40 to round 80).
    Missing max-staleness+1 rounds in a row makes it wait (party-wait=0: stop naming the party)."""
    drop = lambda rounds: lambda msg, grid: "drop" if round_of(msg) in rounds and \
        msg.metadata.dst_node_id == 101 else None  # noqa: E731
    rc = {**RC, "lam": 1e-2}
    gaps = []
    for rounds in (40, 80):
        st = run(FaultyGrid(nodes(), rc, drop({4})), stragglers="stale", lam=1e-2, **{"max-rounds": rounds})
        ref = run(FaultyGrid(nodes(), rc), lam=1e-2, **{"max-rounds": rounds})
        gaps.append(np.max(np.abs(st.decision_test_ - ref.decision_test_)))
    assert [r["stale"] for r in st.history_][2:5] == [0, 1, 0]
    assert gaps[1] < 0.7 * gaps[0]
    with pytest.raises(PartyLost, match=r"party 1 did not come back within party-wait=0 s \(no reply from node 101\)"):
        run(FaultyGrid(nodes(), RC, drop({3, 4, 5})), stragglers="stale", **{"max-staleness": 2})


def _keys(tmp_path, mapping):
    import json
    path = tmp_path / "party-keys.json"
    path.write_text(json.dumps({str(p): key_fingerprint(k) for p, k in mapping.items()}))
    return str(path)


def test_party_keys_bind_registered_keys_to_parties(tmp_path, clean):
    keys = {100: b"PEM-of-node-100", 101: b"PEM-of-node-101"}
    path = _keys(tmp_path, {0: keys[100], 1: keys[101]})
    st = run(FaultyGrid(nodes(), RC, keys=keys), **{"party-keys": path})
    assert np.array_equal(st.decision_test_, clean.decision_test_)
    swapped = _keys(tmp_path, {0: keys[101], 1: keys[100]})
    fp = key_fingerprint(keys[100])[:16]
    with pytest.raises(PermissionError, match=re.escape(f"node 100 claims party 0 but its SuperNode key fingerprint "
                                                        f"{fp}... is not the one party-keys binds to party 0")):
        run(FaultyGrid(nodes(), RC, keys=keys), **{"party-keys": swapped})
    with pytest.raises(PermissionError, match=r"node 100 claims party 0 but its SuperNode key is unknown"):
        run(FaultyGrid(nodes(), RC), **{"party-keys": path})


def test_two_nodes_claiming_one_index_are_refused_by_name():
    """The identify steps of every strategy (vertical, horizontal, SGD baseline, PSI) record
    claims through one function: the same node again is fine, a second node is refused."""
    from flower_vfl.config.schema import ConfigError
    from flower_vfl.strategies.exchange import claim

    seen = {}
    claim(seen, "agent", 3, 100)
    claim(seen, "agent", 3, 100)
    assert seen == {3: 100}
    msg = ("nodes 100 and 101 both claim agent 3; give each SuperNode a distinct partition-id in its "
           "node config")
    with pytest.raises(ValueError) as err:
        claim(seen, "agent", 3, 101)
    assert str(err.value) == msg
    with pytest.raises(ConfigError):
        claim(seen, "agent", 3, 101, ConfigError)
    assert seen == {3: 100}


# ------------------------------------------------------------ a SuperNode restarted with its registered key
KEYS = {100: b"PEM-of-node-100", 101: b"PEM-of-node-101"}


def test_node_restarted_with_its_key_after_the_superlink_saw_it_gone_rejoins_bitwise(tmp_path, clean):
    """Issue 23.3, 'late': node 101 dies in round 5 (the SuperLink answers NODE_UNAVAILABLE) and
    its SuperNode comes back with its registered key: the SAME node id, a new session, an empty
    context.state. The exchange asks it again (its activation time changed; it was on the ignore
    list), checks its key-bound claim with party-keys, re-synchronizes it: the clean run bitwise."""
    def fault(msg, grid):
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101 and grid.sessions[101] == 1:
            grid.restart_same_id(101, offline_for=3)
            return "dead"
        return None

    st = run(FaultyGrid(nodes(), RC, fault, keys=KEYS), **{"party-wait": 10.0,
                                                          "party-keys": _keys(tmp_path, {0: KEYS[100], 1: KEYS[101]})})
    assert st.node_to_party == {100: 0, 101: 1}
    assert np.array_equal(st.decision_test_, clean.decision_test_)
    assert np.array_equal(st.central.z, clean.central.z) and np.array_equal(st.central.y, clean.central.y)
    assert [r["primal_residual"] for r in st.history_] == [r["primal_residual"] for r in clean.history_]


def test_node_restarted_with_its_key_before_the_superlink_noticed_rejoins_bitwise(clean):
    """'Early': the old session took round 5's message and died; the SuperNode is back with the
    same node id before the SuperLink said anything (so no error reply ever comes). The exchange
    sees the new session, stops waiting, re-identifies and re-synchronizes it: bitwise."""
    def fault(msg, grid):
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101 and grid.sessions[101] == 1:
            grid.restart_same_id(101)
            return "drop"
        return None

    st = run(FaultyGrid(nodes(), RC, fault), **{"party-wait": 5.0})
    assert st.node_to_party == {100: 0, 101: 1}
    assert np.array_equal(st.decision_test_, clean.decision_test_)
    assert [r["primal_residual"] for r in st.history_] == [r["primal_residual"] for r in clean.history_]


def test_restarted_session_that_answered_its_old_message_is_refused_then_resume_is_bitwise(clean, tmp_path):
    """The new session pulled round 5's message (sent to the old one) and answered it from an
    empty state: that reply is never used, and the party, whose state is now not the run's, is
    refused by name when it identifies (no silent wrong model); resuming gives the clean run."""
    def fault(msg, grid):
        if round_of(msg) == 5 and msg.metadata.dst_node_id == 101 and grid.sessions[101] == 1:
            grid.restart_same_id(101)
        return None

    state = tmp_path / "state"
    st = sa.make_strategy({**RC, "party-wait": 5.0, "state-dir": str(state)})
    with pytest.raises(ValueError, match=r"party 1 restarted and answered a message sent to its previous session "
                                         r"from an empty state .* Resume from the checkpoint"):
        st.start(FaultyGrid(nodes(), RC, fault))
    assert st.failed_ and load_checkpoint(state)[1]["round"] == 4
    resumed = run(FaultyGrid(nodes(), RC), resume=str(state))
    assert np.array_equal(resumed.decision_test_, clean.decision_test_)
