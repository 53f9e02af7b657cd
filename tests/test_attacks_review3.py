"""A third adversarial review of the party side: a malicious central node against the real ClientApp
handlers (``flower_vfl.apps.client``), a fresh Flower ``Context`` per run, the party's own state-dir.
Each test is an attack the earlier reviews (test_attacks_review.py, test_attacks_review2.py,
test_secagg_roster.py, test_failure_budget.py, ...) did not make, with what the party must do.
"""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca

from _party_handlers import pinned_pair, _task_identity  # noqa: F401  (autouse)
from test_attacks_review2 import M, NAMES, RC, broadcasts, order, sa_adverts, sa_ctxs, sa_decode, sa_nodes


def plain_round(c, q, y, rnd, theta=1 / M):
    """A plain (unmasked) training request; the reply's content (a release or a refusal)."""
    cfg = {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": theta}
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(np.asarray(q, float)), "y": Array(np.asarray(y, float))}),
                     "config": ConfigRecord(cfg)})
    return ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content


def masked_round(c, ads, q, y, rnd):
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    cfg = {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M, ADVERTS: list(ads), PARTIES: list(NAMES)}
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(np.asarray(q, float)), "y": Array(np.asarray(y, float))}),
                     "config": ConfigRecord(cfg)})
    rep = ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content
    assert "release" in rep, dict(rep["refusal"]) if "refusal" in rep else list(rep.keys())
    return rep["release"]["s"].numpy()


# ------------------------------------------------------------------ a plain release is a sum over one party
def test_a_party_that_answered_secure_sums_answers_no_plain_request_of_the_same_values(tmp_path):
    """A plain release is a sum over a roster of one. Run A sums rounds 1 and 2 of three non-private
    parties under pinned keys (party 2's node config: ``secagg-only``, it never releases in the clear).
    Run B (``secagg=false``) sends parties 0 and 1 alone the same broadcasts, from fresh states: a
    non-private party's release is a function of its block and its broadcasts, so they answer exactly what
    they put into run A's sums, in the clear. Before, run A's round-2 sum minus those two releases was
    party 2's exact round-2 release (measured: to 3.5e-12), although party 2 never left its one roster.
    Now a party whose store records a roster (it answered a secure sum) refuses every plain release,
    naming its roster and the fix; party 2's value stays inside the sum."""
    nodes, ids = sa_nodes(tmp_path)
    nodes[2]["secagg-only"] = True
    first, second = broadcasts()
    A = sa_ctxs(nodes, 1)
    for c in A:
        order(c, ids)
    ads = sa_adverts(A)
    sa_decode({n: masked_round(c, ads, *first, 1) for n, c in zip(NAMES, A)}, ads)
    total = sa_decode({n: masked_round(c, ads, *second, 2) for n, c in zip(NAMES, A)}, ads)
    # party 2's round-2 release, computed apart (its own plain run in another state folder)
    c2 = Context(run_id=900, node_id=102, node_config={**nodes[2], "secagg-only": False,
                                                        "state-dir": str(tmp_path / "apart")},
                 state=RecordDict(), run_config={**RC, "secagg": False})
    order(c2, ids)
    a2 = [plain_round(c2, *b, r)["release"]["s"].numpy() for r, b in enumerate((first, second), start=1)][1]
    assert np.max(np.abs(a2)) > 1e-3
    B = sa_ctxs(nodes, 2, rc={**RC, "secagg": False})
    for i in (0, 1):
        order(B[i], ids)
        rep = plain_round(B[i], *first, 1)
        assert "refusal" in rep, "a plain release of a value that entered a secure sum"
        assert rep["refusal"]["code"] == "secagg-roster" and rep["refusal"]["field"] == "config.secagg.adverts"
        assert str(rep["refusal"]["reason"]) == (
            f"party {NAMES[i]!r} answers secure sums over one roster only, [party0,party1,party2] (recorded in its "
            "state folder at its first masked answer); a plain release is a sum over this party alone: the central "
            "node could subtract it from those sums and read the other parties' values. Refused; run with "
            "secagg=true (docs/secagg.md). A plain run of this party's data is its operator's decision only (a new "
            "secagg-name in its node config)")


def test_a_pinned_party_that_released_in_the_clear_enters_no_secure_sum(tmp_path):
    """The same attack the other way round. Run A (``secagg=false``) sends parties 0 and 1 (pinned keys
    in their node configs) rounds 1 and 2 in the clear; run B sums the same broadcasts over the three
    parties (party 2: ``secagg-only``, it never released anything in the clear). Before, B's round-2 sum
    minus A's two plain releases was party 2's exact round-2 release (measured: to 3.5e-12). Now a pinned
    party records its plain release as a sum over itself alone, and refuses a secure sum over any other
    roster, naming the fix; party 2's masked answer alone decodes to nothing."""
    nodes, ids = sa_nodes(tmp_path)
    nodes[2]["secagg-only"] = True
    first, second = broadcasts()
    P = sa_ctxs(nodes, 1, rc={**RC, "secagg": False})
    for i in (0, 1):
        order(P[i], ids)
        for rnd, b in enumerate((first, second), start=1):
            assert "release" in plain_round(P[i], *b, rnd)
    order(P[2], ids)
    rep = plain_round(P[2], *first, 1)                   # party 2 answers nothing in the clear (node config)
    assert rep["refusal"]["reason"].startswith("party 2 releases only under secure aggregation")
    B = sa_ctxs(nodes, 2)
    for c in B:
        order(c, ids)
    ads = sa_adverts(B)
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    for i in (0, 1):
        cfg = {"round": 1, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M, ADVERTS: list(ads), PARTIES: list(NAMES)}
        rd = RecordDict({"vectors": ArrayRecord({"q": Array(first[0]), "y": Array(first[1])}),
                         "config": ConfigRecord(cfg)})
        rep = ca.train(Message(rd, dst_node_id=B[i].node_id, message_type="train"), B[i]).content
        assert rep["refusal"]["code"] == "secagg-roster"
        assert str(rep["refusal"]["reason"]) == (
            f"party {NAMES[i]!r} released in the clear before (a plain release is a sum over this party alone, "
            "recorded in its state folder); refused in a secure sum over [party0,party1,party2]: the central node "
            "could have the same values again in the clear (the same broadcasts, or a resumed plan's stored draws), "
            "subtract them from the sum and read the other parties' values. A secure run of this party's data is "
            "its operator's decision only (a new secagg-name in its node config, pinned by the others)")
    # plain again in a third run: the same roster of one, answered
    C = sa_ctxs(nodes, 3, rc={**RC, "secagg": False})
    order(C[0], ids)
    assert "release" in plain_round(C[0], *first, 1)


# ------------------------------------------------------------------ distributed noise: one draw per round, ever
def _dist_nodes(tmp_path):
    """Two private parties with distributed noise (k = 0: each adds half the noise inside the sum),
    pinned keys, their own state folders."""
    nodes = pinned_pair(tmp_path)
    for i in range(2):
        nodes[i].update({"dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 2, "dp-eval-rounds": 1,
                         "dp-distributed-max-colluders": 0})
        nodes[i].pop("secagg-only", None)
    return nodes


DIST_RC = {"dataset": "breast_cancer", "num-parties": 2, "secagg": True, "lam": 1e-3}


def _dist_identify(c, token=None):
    import json
    cfg = {"want": "party", **({"plans": json.dumps({str(c.node_config["partition-id"]): token})} if token else {})}
    rep = ca.identify(Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=c.node_id,
                              message_type="query.identify"), c)
    return rep.content["identity"]


def _dist_train(c, ads, q, y, rnd):
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    cfg = {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 0.5, ADVERTS: list(ads), PARTIES: ["party0", "party1"]}
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(q), "y": Array(y)}), "config": ConfigRecord(cfg)})
    return ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content


def _train_entries(nc):
    from flower_vfl.privacy.store import party_store
    st = party_store(nc["state-dir"])
    return [(e.run, e.round, e.kind, e.mechanism) for src, _ in st.sources() for e in st.entries(src)]


def test_a_distributed_partys_round_is_one_draw_across_a_full_disk_a_restart_and_a_resume(tmp_path, monkeypatch):
    """A distributed party adds only half the noise (k = 0, two adders): one of its values in two sums
    with fresh draws of the other party would let the central node average the other's share away, and
    one round answered with two draws would give it the difference of two of its releases. The central
    node tries every path to a second draw of round 1: a full disk between the party's ledger charge and
    its masked answer (retried), a node restart in the run (its key lost: re-keyed, asked again), a resumed
    run continuing the plan (the same round, the same broadcast), and the same round with another
    broadcast. Each time the party answers its one stored integer vector (the decoded sums are equal,
    bitwise), is charged once per round (its ledger: one Skellam entry per round), and refuses the other
    broadcast before any draw."""
    from flower_vfl.privacy import store as store_mod
    from flower_vfl.privacy.distributed import DistributedParty
    from flower_vfl.io.data import party_block
    nodes = _dist_nodes(tmp_path)
    n = party_block("breast_cancer", 0, 2)[0].shape[0]
    rng = np.random.default_rng(11)
    q, y = rng.normal(size=n) * 0.1, rng.normal(size=n) * 1e-3
    draws = []
    real = DistributedParty.distributed_release

    def counted(self, *a, **kw):
        before = len(self.ledger.entries)
        out = real(self, *a, **kw)
        if len(self.ledger.entries) > before:
            draws.append(self.party_id)
        return out
    monkeypatch.setattr(DistributedParty, "distributed_release", counted)

    def ctxs(run_id):
        return [Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                        run_config=dict(DIST_RC)) for i in range(2)]

    A = ctxs(1)
    tokens = [_dist_identify(c)["plan"] for c in A]
    ads = sa_adverts(A)
    real_commit, failed = store_mod.PartyStore.commit_secagg, []

    def full_once(self, *a, **kw):          # party 0's masked answer meets a full disk, once
        if not failed and "partition:0/" in str(a[0]):
            failed.append(1)
            raise store_mod.StoreDiskError("cannot record the masked answer: No space left on device")
        return real_commit(self, *a, **kw)
    monkeypatch.setattr(store_mod.PartyStore, "commit_secagg", full_once)
    with pytest.raises(store_mod.StoreDiskError):      # after the charge, before the answer leaves
        _dist_train(A[0], ads, q, y, 1)
    assert failed == [1] and draws == [0]
    masked = {f"party{i}": _dist_train(c, ads, q, y, 1)["release"]["s"].numpy() for i, c in enumerate(A)}
    first = sa_decode(masked, ads)
    assert draws == [0, 1]                   # party 0 drew once (the retry sent its stored vector)
    # party 0's node restarts within the run: its key is lost, the central node re-keys both parties
    A[0] = Context(run_id=1, node_id=100, node_config=dict(nodes[0]), state=RecordDict(), run_config=dict(DIST_RC))
    rep = _dist_train(A[0], ads, q, y, 1)
    assert rep["refusal"]["code"] == "secagg-rekey"
    ads2 = sa_adverts(A)
    assert ads2 != ads
    again = sa_decode({f"party{i}": _dist_train(c, ads2, q, y, 1)["release"]["s"].numpy()
                       for i, c in enumerate(A)}, ads2)
    assert np.array_equal(again, first) and draws == [0, 1]
    # a resumed run continuing both plans: round 1 with another broadcast is refused by the ledger before
    # any draw; round 1 again is the same sum; the other broadcast after it, refused by the sums record
    B = ctxs(2)
    for c, t in zip(B, tokens):
        assert _dist_identify(c, t)["continued"] is True
    ads3 = sa_adverts(B)
    for i, c in enumerate(B):
        rep = _dist_train(c, ads3, q, 2 * y, 1)
        assert rep["refusal"]["reason"] == (
            f"party {i} already answered the train request of round 1 with other inputs; a second answer would "
            "reveal the noise, so it is refused")
    resumed = sa_decode({f"party{i}": _dist_train(c, ads3, q, y, 1)["release"]["s"].numpy()
                         for i, c in enumerate(B)}, ads3)
    assert np.array_equal(resumed, first) and draws == [0, 1]
    for c in B:
        assert _dist_train(c, ads3, q, 2 * y, 1)["refusal"]["reason"] == (
            "round 1 (train) was already answered for another broadcast in this run; refused (one masked answer "
            "per round)")
    # party 0's plan resumed beside a fresh plan of party 1 (a fresh share to average against its stored
    # round 1): party 1's budget holds one plan, reserved by run 1; refused before any draw
    C = ctxs(3)
    assert _dist_identify(C[0], tokens[0])["continued"] is True
    assert _dist_identify(C[1])["affordable"] is False
    ads4 = sa_adverts(C)
    rep = _dist_train(C[1], ads4, q, y, 1)
    assert rep["refusal"]["reason"].startswith(
        "party 1 refuses run 3: its budget is reserved by run 2 (1 of 3 planned releases made). With that reservation "
        "ε=2 of its budget ε=2 is taken")
    assert draws == [0, 1]
    for i in range(2):
        assert [e[1:] for e in _train_entries(nodes[i])] == [(1, "train", "skellam")]


def test_a_private_partys_stored_draw_released_in_the_clear_enters_no_secure_sum(tmp_path):
    """A private party's plan answers a round again with its stored draw, in any run that continues the
    plan: the same draw is post-processing for the party itself. Run A (``secagg=false``): private party 0
    (pinned keys) releases round 1 in the clear. Run B continues its plan (its token) under secure
    aggregation beside non-private party 1 (``secagg-only``, a fresh state): the same round-1 broadcast
    gets party 0's stored draw, masked. Before, the decoded sum minus run A's clear release was party 1's
    exact round-1 release (measured: to 3.5e-12 of 0.05). Now party 0 recorded its clear release and refuses
    the secure sum before anything is computed or charged; its ledger holds the one round-1 release."""
    import json
    from flower_vfl.io.data import party_block
    nodes = pinned_pair(tmp_path)
    rc = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-3}
    n = party_block("breast_cancer", 0, 2)[0].shape[0]
    rng = np.random.default_rng(5)
    q, y = rng.normal(size=n) * 0.1, rng.normal(size=n) * 1e-3

    def ctx(i, run_id, secagg):
        return Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                       run_config={**rc, "secagg": secagg})

    a0 = ctx(0, 1, False)
    token = _dist_identify(a0)["plan"]
    rep = plain_round(a0, q, y, 1, theta=0.5)          # the inputs of _dist_train's request
    assert "release" in rep
    B = [ctx(0, 2, True), ctx(1, 2, True)]
    cfg = {"plans": json.dumps({"0": token})}
    ident = ca.identify(Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=100,
                                message_type="query.identify"), B[0]).content["identity"]
    assert ident["continued"] is True
    ads = sa_adverts(B)
    rep = _dist_train(B[0], ads, q, y, 1)
    assert rep["refusal"]["code"] == "secagg-roster"
    assert str(rep["refusal"]["reason"]).startswith(
        "party 'party0' released in the clear before (a plain release is a sum over this party alone, recorded in "
        "its state folder); refused in a secure sum over [party0,party1]")
    assert [e[1:] for e in _train_entries(nodes[0])] == [(1, "train", "gaussian")]
