"""A second adversarial review of the party side: a malicious central node against the real ClientApp
handlers (``flower_vfl.apps.client``, ``flower_vfl.clients.psi_party``), a fresh Flower ``Context`` per
run, the party's own state-dir. Each test is an attack the earlier attack tests (test_psi_bound.py,
test_attacks_review.py, test_secagg_roster.py, ...) did not make, with what the party must do.
"""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.clients import psi_party
from flower_vfl.io import psi
from flower_vfl.io.bundled import write_table
from flower_vfl.io.psi_log import PsiBoundError, psi_log_rows

from _party_handlers import _task_identity  # noqa: F401  (autouse)


def order(context, ids, split="train"):
    msg = Message(RecordDict({"psi": ConfigRecord({"split": split, "order": psi.encode_ids(ids),
                                                   "digest": psi.ids_digest(ids)})}), dst_node_id=context.node_id,
                  message_type="query.psi_order")
    return psi_party.psi_order(msg, context).content["psi"]


# ------------------------------------------------------------------ PSI: a refused order names no ID for free
def test_a_refused_order_does_not_make_its_ids_free_to_test_one_by_one(tmp_path):
    """The cap (psi-max-asked x own IDs) bounds what a requester learns about IDs the party does not
    hold. Once the tests are past the cap, an order is refused up front unless every ID in it was named
    in an order before. Before, a refused order counted as "named": one order of 2,000 guessed IDs
    (refused; it tells only that some are not held), then 2,000 orders of one ID each, all "named before",
    were answered and told the membership of every guess (measured: all 2,000 right, 1,946 not held,
    against a cap of 300). Now only an order the party accepted names IDs: the first single-ID order
    after the big one is refused before it is compared with the party's IDs."""
    rng = np.random.default_rng(1)
    held = sorted(f"c{v:05d}" for v in rng.choice(10_000, 300, replace=False))
    path = write_table(tmp_path / "bank.csv", held, rng.standard_normal((300, 2)), ["f1", "f2"], "csv")
    nc = {"partition-id": 1, "data-path": str(path), "state-dir": str(tmp_path / "state")}

    def ctx(run):
        return Context(run_id=run, node_id=7, node_config=dict(nc), state=RecordDict(), run_config={})

    assert order(ctx(0), held[:10])["n_rows"] == 10      # an honest order: accepted, its IDs named
    guesses = [f"c{v:05d}" for v in range(2000)]
    absent = sum(g not in set(held) for g in guesses)
    with pytest.raises(psi_party.DataError, match=r"some ID\(s\) of the agreed order are not in this party's"):
        order(ctx(1), guesses)                  # under the cap when asked: refused (no count), its absent IDs counted
    source = f"{path.resolve()}#id=id"
    fresh = [g for g in guesses if g not in held[:10]]       # the IDs not named in an accepted order
    with pytest.raises(PsiBoundError) as err:
        order(ctx(2), [fresh[0]])
    assert str(err.value) == (
        f"PSI bound: this order names 1 IDs never named in an accepted order before, and the {absent} membership tests "
        f"already answered for {source} (0 encrypted IDs in PSI requests, {absent} IDs of agreed orders it does not "
        "hold) are already past this party's cap of 300 (psi-max-asked=1 × its 300 IDs; one cap for PSI requests "
        "and agreed orders). Refused, across all runs: raise the node-config key psi-max-asked if the label owner "
        "really holds that many rows")
    for k, g in enumerate(fresh[:400]):         # guesses alone (more than the cap): each refused unread
        with pytest.raises(PsiBoundError):
            order(ctx(10 + k), [g])
    rows = {r["kind"]: r for r in psi_log_rows(nc["state-dir"])}
    assert rows["absent"]["distinct_asked"] == absent and rows["order"]["refused"] == 1 + 400
    assert rows["order"]["distinct_asked"] == 10         # only the accepted order's IDs are "named before"
    # the honest order again, past the cap: its IDs were named in an accepted order, no new test
    assert order(ctx(5000), held[:10])["n_rows"] == 10


# ------------------------------------------------------------------ secure sums: the block's rows are bound
M = 3
NAMES = [f"party{i}" for i in range(M)]
RC = {"num-parties": M, "secagg": True, "lam": 1e-3}
N = 40


def sa_nodes(tmp_path):
    """Three non-private parties on their own files (the same 40 IDs), keys pinned by the others."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from flower_vfl.secagg import public_key_hex, signing_key_pem
    rng = np.random.default_rng(0)
    ids = [f"p{i:03d}" for i in range(N)]
    keys = [Ed25519PrivateKey.generate() for _ in range(M)]
    nodes = {}
    for i in range(M):
        f = write_table(tmp_path / f"d{i}.csv", ids, rng.normal(size=(N, 3)), ["a", "b", "c"], "csv")
        (tmp_path / f"k{i}.pem").write_bytes(signing_key_pem(keys[i]))
        nodes[i] = {"partition-id": i, "data-path": str(f), "state-dir": str(tmp_path / f"s{i}"),
                    "secagg-signing-key": str(tmp_path / f"k{i}.pem"),
                    "secagg-pins": ", ".join(f"party{j}={public_key_hex(keys[j])}" for j in range(M) if j != i)}
    return nodes, ids


def sa_ctxs(nodes, run_id, rc=RC):
    return [Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                    run_config=dict(rc)) for i in range(M)]


def sa_adverts(ctxs):
    return [ca.secagg_keys(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=c.node_id,
                                   message_type="query.secagg_keys"), c).content["secagg"]["advert"] for c in ctxs]


def sa_round(c, ads, q, y, rnd):
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    cfg = {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M}
    if ads is not None:
        cfg.update({ADVERTS: list(ads), PARTIES: list(NAMES)})
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(np.asarray(q, float)), "y": Array(np.asarray(y, float))}),
                     "config": ConfigRecord(cfg)})
    rep = ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content
    assert "release" in rep, dict(rep["refusal"]) if "refusal" in rep else list(rep.keys())
    return rep["release"]["s"].numpy()


def sa_decode(masked, ads):
    from flower_vfl.secagg import Advert, Roster, secure_sum
    return secure_sum(masked, Roster([Advert.from_bytes(a) for a in ads]))


def broadcasts():
    rng = np.random.default_rng(7)
    return (rng.normal(size=N) * 0.1, rng.normal(size=N) * 1e-3), (np.zeros(N), np.zeros(N))


def plain_release(tmp_path, node, ids, rounds):
    """Party ``node``'s plain releases for the broadcasts ``rounds`` (secagg off, a fresh state-dir)."""
    c = Context(run_id=900, node_id=102, node_config={**node, "state-dir": str(tmp_path / "plain")},
                state=RecordDict(), run_config={**RC, "secagg": False})
    order(c, ids)
    return [sa_round(c, None, q, y, rnd) for rnd, (q, y) in enumerate(rounds, start=1)]


def test_a_party_re_aligned_mid_run_is_not_in_a_sum_with_the_others(tmp_path):
    """The history a non-private party masks against starts from the training order it agreed to, but
    only for a fresh state. Run A: every party aligned to order O, round 1 (q, y), round 2 (0, 0). Run B:
    the same, but between the rounds the central node sends party 2 alone another psi_order, O rotated by
    one row. With q = 0 party 2's x-update is the same (its target is its own last release, permuted
    with its rows) and it releases its round-2 scores rotated; parties 0 and 1 answer as in run A. Before,
    run B's round 2 decoded and A - B was a2 - roll(a2, -1) (measured: to 3e-12), party 2's exact release
    up to one constant. Now the masks are bound to the rows the block is built on at answer time:
    run B's round 2 does not decode; an honest second run decodes the same sum as run A."""
    from flower_vfl.secagg import FixedPoint, SumMismatch
    nodes, ids = sa_nodes(tmp_path)
    first, second = broadcasts()

    def run(run_id, realign):
        ctxs = sa_ctxs(nodes, run_id)
        for c in ctxs:
            order(c, ids)
        ads = sa_adverts(ctxs)
        sa_decode({n: sa_round(c, ads, *first, 1) for n, c in zip(NAMES, ctxs)}, ads)
        if realign:
            order(ctxs[2], ids[1:] + ids[:1])
        return {n: sa_round(c, ads, *second, 2) for n, c in zip(NAMES, ctxs)}, ads

    a = sa_decode(*run(1, False))
    a2 = plain_release(tmp_path, nodes[2], ids, [first, second])[1]
    assert np.max(np.abs(a2 - np.roll(a2, -1))) > 1e-3           # what the difference would have been
    again = sa_decode(*run(2, False))                            # an honest second run: the same sum
    assert np.max(np.abs(again - a)) <= FixedPoint([1e4] * M).error_bound
    masked, ads = run(3, True)
    with pytest.raises(SumMismatch):
        sa_decode(masked, ads)


def test_a_resume_that_shows_one_party_another_order_is_not_a_sum(tmp_path):
    """The same through the resume tokens (docs/secagg.md, "Resume"): run A aligns every party to O and
    sums rounds 1 and 2; run B resumes every party from run A's token after round 1, but aligns party 2
    to O rotated by one row first. Its restored history is run A's, its block another: before, B's round 2
    minus A's was a2 - roll(a2, -1). Now the masks are bound to the block's rows: no sum."""
    from flower_vfl.clients.party_secagg import RESUME_ROUND
    from flower_vfl.secagg import SumMismatch
    nodes, ids = sa_nodes(tmp_path)
    first, second = broadcasts()
    A = sa_ctxs(nodes, 1)
    tokens = []
    for c in A:
        order(c, ids)
        rep = ca.identify(Message(RecordDict({"config": ConfigRecord({"want": "party"})}), dst_node_id=c.node_id,
                                  message_type="query.identify"), c)
        tokens.append(str(rep.content["identity"]["plan"]))
    ads = sa_adverts(A)
    sa_decode({n: sa_round(c, ads, *first, 1) for n, c in zip(NAMES, A)}, ads)
    a = sa_decode({n: sa_round(c, ads, *second, 2) for n, c in zip(NAMES, A)}, ads)

    def resumed(run_id, rotate):
        ctxs = sa_ctxs(nodes, run_id)
        for i, c in enumerate(ctxs):
            order(c, ids[1:] + ids[:1] if (rotate and i == 2) else ids)
            cfg = {"plans": json.dumps({str(i): tokens[i]}), RESUME_ROUND: 1}
            rep = ca.identify(Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=c.node_id,
                                      message_type="query.identify"), c)
            assert str(rep.content["identity"]["plan"]) == tokens[i]     # restored its round-1 state
        ads = sa_adverts(ctxs)
        return {n: sa_round(c, ads, *second, 2) for n, c in zip(NAMES, ctxs)}, ads

    from flower_vfl.secagg import FixedPoint
    honest = sa_decode(*resumed(2, False))                       # the honest resume: run A's round-2 sum
    assert np.max(np.abs(honest - a)) <= FixedPoint([1e4] * M).error_bound
    masked, ads = resumed(3, True)
    with pytest.raises(SumMismatch):
        sa_decode(masked, ads)


def test_an_honest_own_data_run_with_held_out_rows_is_unchanged_by_the_binding(tmp_path, monkeypatch):
    """The binding to the rows costs an honest run nothing: every party of an honest run is shown the
    same training and held-out orders, so own data (a9a, 600 training rows, 200 held out) trained under
    secure aggregation with evaluation rounds decodes every sum, and its history (train and test loss
    each round) is bitwise the one of the same run with masks bound to the broadcast history alone."""
    from _own_data_helpers import HANDLERS, RANGES, node_configs, run_config, write_a9a_files
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.io.bundled import write_party_files
    from flower_vfl.io.data import load_all
    from flower_vfl.strategies import own_data
    X, y, Xt, yt = load_all("a9a")
    train, score = write_a9a_files(tmp_path, X[:600], y[:600], Xt[:200])
    test = write_party_files(Xt[200:400], yt[200:400], [f"v{i:06d}" for i in range(200)], RANGES, tmp_path, "csv",
                             seed=5, prefix="test")
    handlers = {**HANDLERS, "query.secagg_keys": ca.secagg_keys}

    def run(tag, run_id):
        nodes = node_configs(train, score, "csv", tmp_path / tag,
                             extra={m: {"test-path": str(test[m]), "state-dir": str(tmp_path / tag / f"s{m}")}
                                    for m in range(M)})
        rc = run_config(train, score, tmp_path / tag, secagg=True,
                        **{"max-rounds": 6, "acceleration": "none", "labels-test-path": str(test[0])})
        strategy = own_data.train(LocalGrid(handlers, nodes, rc, run_id=run_id), rc, sa.make_strategy)
        return [(h["round"], h["train_loss"], h.get("test_loss")) for h in strategy.history_]

    bound = run("bound", 1)
    assert bound[-1][2] is not None and np.isfinite(bound[-1][2])      # the held-out sums decoded
    monkeypatch.setattr(psi_party, "bound_to_alignment", lambda context, history, kind: history)
    assert run("unbound", 2) == bound


def test_a_private_partys_held_out_scores_stay_inside_the_sum_when_it_is_re_aligned(tmp_path):
    """Private parties (own data, one model release each) under secure aggregation: the central node
    learns only the sum of their held-out scores D_test x~ (docs/secagg.md, "What the central node
    learns"). Every later evaluation is served from the one released x~, so evaluations 1 and 2 decode the
    same sum. Before, the central node then re-aligned party 2's held-out rows (its test order rotated by
    one row) and evaluation 3 decoded too: sum 1 - sum 3 was t2 - roll(t2, -1) (measured: to 3e-12),
    party 2's own held-out scores up to one constant. Now a private party's masks are bound to the row
    orders its block is built on as well: evaluation 3 does not decode."""
    from flower_vfl.secagg import SumMismatch
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    nodes, ids = sa_nodes(tmp_path)
    rng = np.random.default_rng(3)
    tids = [f"t{i:03d}" for i in range(30)]
    for i in range(M):
        f = write_table(tmp_path / f"t{i}.csv", tids, rng.normal(size=(30, 3)), ["a", "b", "c"], "csv")
        nodes[i].update({"test-path": str(f), "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 0,
                         "dp-eval-rounds": 1})
    ctxs = sa_ctxs(nodes, 1)
    for c in ctxs:
        order(c, ids)
        order(c, tids, split="test")
        rep = ca.identify(Message(RecordDict({"config": ConfigRecord({"want": "party"})}), dst_node_id=c.node_id,
                                  message_type="query.identify"), c)
        assert rep.content["identity"]["affordable"] is True
    ads = sa_adverts(ctxs)
    q, y = broadcasts()[0]

    def evaluate(c, rnd, final):
        rd = RecordDict({"vectors": ArrayRecord({"q": Array(q), "y": Array(y)}),
                         "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M,
                                                 "final_update": final, ADVERTS: list(ads), PARTIES: list(NAMES)})})
        rep = ca.evaluate(Message(rd, dst_node_id=c.node_id, message_type="evaluate"), c).content
        assert "release" in rep, dict(rep["refusal"]) if "refusal" in rep else list(rep.keys())
        return rep["release"]["s_test"].numpy()

    first = sa_decode({n: evaluate(c, 1, True) for n, c in zip(NAMES, ctxs)}, ads)     # x~ released, charged
    again = sa_decode({n: evaluate(c, 2, False) for n, c in zip(NAMES, ctxs)}, ads)    # served from x~, free
    assert np.array_equal(first, again) and np.max(np.abs(first)) > 0.1
    order(ctxs[2], tids[1:] + tids[:1], split="test")
    masked = {n: evaluate(c, 3, False) for n, c in zip(NAMES, ctxs)}
    with pytest.raises(SumMismatch):
        sa_decode(masked, ads)
