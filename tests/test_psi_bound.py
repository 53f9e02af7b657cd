"""Issue 20 (2, 4): only a party's node config names its files, and PSI reveals only the
intersection within the party's own bound, across all runs and requests.

Every attack goes through the real ClientApp handlers (flower_vfl.clients.psi_party) with a
fresh flwr Context per run, the way a malicious central node would reach them."""

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from flower_vfl.clients import psi_party
from flower_vfl.io import psi
from flower_vfl.io.bundled import write_table
from flower_vfl.io.psi_log import PsiBoundError, psi_log_rows

#: everything a run config once used to choose a party's data (issue 20, item 2)
HOSTILE_RC = {"party-data-paths": "{other}", "party-test-paths": "{other}", "party-score-paths": "{other}",
              "party-model-dirs": "{elsewhere}", "preprocess": "standardize", "id-column": "other_id"}


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def ctx(node_config, run_id, run_config=None):
    return Context(run_id=run_id, node_id=7, node_config=dict(node_config), state=RecordDict(),
                   run_config=dict(run_config or {}))


def party_file(path, ids, seed=0, id_column="id"):
    X = np.random.default_rng(seed).standard_normal((len(ids), 2))
    return write_table(path, list(ids), X, ["f1", "f2"], "csv", id_column=id_column)


def ask(context, owner_ids, split="train", key="fresh"):
    """One PSI request of ``owner_ids`` through the real handler; the label owner's view."""
    lo = psi.LabelOwnerPSI(owner_ids, key=key)
    msg = Message(RecordDict({"psi": ConfigRecord({"split": split, "request": lo.request(), "fpr": 1e-9,
                                                   "structure": "raw"})}), dst_node_id=7,
                  message_type="query.psi_answer")
    rec = psi_party.psi_answer(msg, context).content["psi"]
    return {owner_ids[i] for i in lo.intersect(bytes(rec["setup"]), bytes(rec["response"]))}


def order(context, ids, split="train"):
    msg = Message(RecordDict({"psi": ConfigRecord({"split": split, "order": psi.encode_ids(ids),
                                                   "digest": psi.ids_digest(ids)})}), dst_node_id=7,
                  message_type="query.psi_order")
    return psi_party.psi_order(msg, context).content["psi"]


@pytest.fixture
def party(tmp_path):
    """A party holding 3,000 IDs out of a guessable space of 10,000 (c00000 ... c09999)."""
    rng = np.random.default_rng(1)
    held = sorted(f"c{v:05d}" for v in rng.choice(10_000, 3_000, replace=False))
    path = party_file(tmp_path / "bank.csv", held)
    return {"partition-id": 1, "data-path": str(path), "state-dir": str(tmp_path / "state")}, held


GUESSES = [f"c{v:05d}" for v in range(10_000)]


def test_ten_thousand_guessed_ids_are_refused(party):
    nc, held = party
    with pytest.raises(PsiBoundError) as err:
        ask(ctx(nc, 1), GUESSES)
    source = f"{Path(nc['data-path']).resolve()}#id=id"
    assert str(err.value) == (
        f"PSI bound: this request holds 10000 items, 10000 of them never asked before; with the 0 membership tests "
        f"already answered for {source} (0 encrypted IDs in PSI requests, 0 IDs of agreed orders it does not hold) "
        "that would pass this party's cap of 3000 (psi-max-asked=1 × its 3000 IDs; one cap for PSI requests and "
        "agreed orders). Refused, across all runs: raise the node-config key psi-max-asked if the label owner "
        "really holds that many rows")
    # the refusal counted nothing: an honest request of the party's own size still passes
    assert ask(ctx(nc, 2), held[:3000]) == set(held)


def test_five_requests_of_two_thousand_are_refused_past_the_cap(party):
    """psi-max-request caps one request; the log caps them all, across runs (a fresh Context
    each, a fresh label-owner key each: every item is new to the party)."""
    nc, held = party
    nc = dict(nc, **{"psi-max-request": 2000})
    learned = set()
    refused = []
    for k in range(5):
        try:
            learned |= ask(ctx(nc, 100 + k), GUESSES[2000 * k:2000 * (k + 1)])
        except PsiBoundError as exc:
            refused.append(k)
            assert "with the 2000 membership tests already answered for " in str(exc)
            assert "(2000 encrypted IDs in PSI requests, 0 IDs of agreed orders it does not hold)" in str(exc)
    assert refused == [1, 2, 3, 4]
    assert learned == {h for h in held if h < "c02000"} and len(learned) < len(held)
    rows = psi_log_rows(nc["state-dir"])
    assert [(r["kind"], r["distinct_asked"], r["answers"], r["refused"], r["cap"]) for r in rows] == \
        [("request", 2000, 1, 4, 3000)]


def test_the_cap_holds_across_runs_and_a_raised_cap_is_the_partys_choice(party):
    nc, held = party
    ask(ctx(nc, 1), GUESSES[:2500])
    with pytest.raises(PsiBoundError):
        ask(ctx(nc, 2), GUESSES[2500:3100])                 # 2500 + 600 > 3000, in a new run
    assert len(ask(ctx(dict(nc, **{"psi-max-asked": 2.0}), 3), GUESSES[2500:3100])) > 0


def test_an_honest_label_owner_realigns_as_often_as_it_likes_with_its_kept_key(party, tmp_path):
    """The kept key gives one ID the same blinded item every run: the log counts it once."""
    nc, held = party
    owner = held[:2900]
    owner_state = str(tmp_path / "owner")
    for run in range(5):
        got = ask(ctx(nc, 10 + run), owner, key=psi.label_owner_key(owner_state))
        assert got == set(owner)
        order(ctx(nc, 10 + run), owner)                     # the agreed order: a subset of its own set
    rows = {r["kind"]: r for r in psi_log_rows(nc["state-dir"])}
    assert rows["request"]["distinct_asked"] == 2900 and rows["request"]["answers"] == 5
    assert rows["order"]["distinct_asked"] == 2900 and rows["order"]["refused"] == 0
    assert "absent" not in rows                             # an honest order costs no membership test


def test_guessed_ids_sent_as_the_agreed_order_are_counted_too(party):
    """Refusing an order tells the requester that some ID in it is not held: probing through
    psi_order instead of psi_answer meets the same cap (the IDs not held are the tests)."""
    nc, held = party
    source = f"{Path(nc['data-path']).resolve()}#id=id"
    seen = 0
    with pytest.raises(PsiBoundError) as err:
        for k in range(20):                                 # 500 guesses per order, 10,000 in all
            try:
                order(ctx(nc, 200 + k), GUESSES[500 * k:500 * (k + 1)])
            except psi_party.DataError:
                pass                                         # some guess is not held: refused, counted
            seen += 500
    absent = sum(g not in set(held) for g in GUESSES[:seen])
    assert absent > 3000 >= absent - 500                     # one order past the cap, then none
    assert str(err.value) == (
        f"PSI bound: this order names 500 IDs never named in an accepted order before, and the {absent} membership tests "
        f"already answered for {source} (0 encrypted IDs in PSI requests, {absent} IDs of agreed orders it does not "
        "hold) are already past this party's cap of 3000 (psi-max-asked=1 × its 3000 IDs; one cap for PSI requests "
        "and agreed orders). Refused, across all runs: raise the node-config key psi-max-asked if the label owner "
        "really holds that many rows")


def test_requests_and_orders_share_one_cap(party):
    """Before, each kind had its own cap: 3,000 guessed IDs asked in requests and 3,000 more in
    orders told the requester the membership of 6,000 IDs (twice psi-max-asked). Now the second
    half meets the cap left by the first: what the requester learns of IDs the party does not
    hold is bounded by one cap, across requests and orders and runs."""
    nc, held = party
    own = set(held)
    learned = ask(ctx(nc, 1), GUESSES[:2800])               # 2,800 tests: the membership of 2,800 IDs
    tested = set(GUESSES[:2800])
    for k, g in enumerate(GUESSES[2800:]):                  # then one guessed ID per order
        try:
            order(ctx(nc, 10 + k), [g])
            learned.add(g)                                   # accepted: held
        except psi_party.DataError:
            pass                                             # refused: not held (a test, counted)
        except PsiBoundError:
            break                                            # refused up front: nothing learned
        tested.add(g)
    rows = {r["kind"]: r for r in psi_log_rows(nc["state-dir"])}
    assert rows["request"]["distinct_asked"] == 2800 and rows["absent"]["distinct_asked"] == 201
    # every ID whose absence the requester learned is a test within the cap (+ the one past it)
    assert len(tested - own) <= 3000 + 1
    assert len(tested) < 2 * 3000 and learned <= own
    again = sorted(learned & set(GUESSES[2800:]))[:5]       # IDs named in an accepted order before:
    assert len(again) == 5 and order(ctx(nc, 99_999), again)["n_rows"] == 5   # no new test, answered
    with pytest.raises(PsiBoundError, match="this order names 1 IDs never named in an accepted order before"):
        order(ctx(nc, 99_998), [held[0]])                    # past the cap: refused before it is compared


def test_an_order_naming_an_id_twice_is_refused(party):
    nc, held = party
    with pytest.raises(psi_party.DataError, match=r"names 1 ID\(s\) more than once"):
        order(ctx(nc, 1), [held[0], held[1], held[0]])


def test_run_config_keys_choose_nothing_the_party_reads(party, tmp_path):
    """A run config naming another file, test/score files, model folders, preprocessing and an
    ID column (the keys a party once fell back to) changes nothing the handlers read."""
    nc, held = party
    other_ids = [f"x{v:04d}" for v in range(50)]
    other = party_file(tmp_path / "unrelated.csv", other_ids, seed=9, id_column="other_id")
    rc = {k: v.format(other=other, elsewhere=tmp_path / "elsewhere") for k, v in HOSTILE_RC.items()}
    clean, hostile = ctx(nc, 1), ctx(nc, 2, rc)
    assert ask(hostile, other_ids + held[:10]) == set(held[:10])   # the node config's file, not 'other'
    for c in (clean, hostile):
        order(c, held[:100])
    D_clean, _, pre_clean, ids_clean = psi_party.own_blocks(clean)
    D_host, _, pre_host, ids_host = psi_party.own_blocks(hostile)
    assert pre_host.kind == pre_clean.kind == "none"
    np.testing.assert_array_equal(D_host, D_clean)
    assert list(ids_host) == held[:100]
    assert psi_party.model_path(hostile) == psi_party.model_path(clean) == \
        tmp_path / "vfl-model" / "party-1.npz"


def test_a_party_with_no_data_declared_does_not_answer_with_a_run_config_file(tmp_path):
    """Issue 20: a party set up with only data-dir answered PSI with the IDs of the file a run
    config named. Now it refuses, naming its node-config key."""
    other = party_file(tmp_path / "unrelated.csv", [f"x{v}" for v in range(20)])
    nc = {"partition-id": 1, "data-dir": str(tmp_path), "state-dir": str(tmp_path / "state")}
    rc = {"party-data-paths": f"{other},{other}", "id-column": "id"}
    assert not psi_party.uses_own_data(ctx(nc, 1, rc))
    with pytest.raises(psi_party.DataError, match=r"the node-config key data-path is empty"):
        ask(ctx(nc, 1, rc), [f"x{v}" for v in range(20)])


def test_simulate_hands_each_party_its_files_in_its_node_config(tmp_path):
    """`flower-vfl simulate --party ...` (cli/own.py): the files go in the node configs written
    to FLOWER_VFL_NODE_CONFIG, none in the run config."""
    import argparse

    from flower_vfl.cli.own import own_node_configs
    lo = write_table(tmp_path / "owner.csv", ["a", "b"], np.zeros((2, 0)), [], "csv", y=np.array([0, 1]))
    p1 = party_file(tmp_path / "p1.csv", ["a", "b"])
    args = argparse.Namespace(labels=str(lo), party=[str(p1)], preprocess="maxabs", id_column="id",
                              label_column="label", psi_max_asked=1.5)
    rc, nodes, n = own_node_configs(args, {"model-dir": str(tmp_path / "m")}, {0: {"partition-id": 0}})
    assert n == 1 and not any(k.startswith("party-") or k == "preprocess" for k in rc)
    assert nodes[0] == {"partition-id": 0, "data-path": str(p1), "id-column": "id", "preprocess": "maxabs",
                        "psi-max-asked": 1.5, "model-dir": str(tmp_path / "m")}
    rc, nodes, _ = own_node_configs(argparse.Namespace(**{**vars(args), "preprocess": "none"}),
                                    {"mode": "predict", "model-dir": str(tmp_path / "m")}, {})
    assert nodes[0]["score-path"] == str(p1) and "data-path" not in nodes[0]


def test_a_flower_run_id_above_two_to_the_63_is_logged(party):
    """Flower's run ids are unsigned 64-bit: the loopback attack test met 11187668073276597044,
    which a SQLite INTEGER cannot hold (the handler crashed instead of answering). The log keeps
    the run as text, exactly."""
    nc, held = party
    run = 2**64 - 5
    assert ask(ctx(nc, run), held[:100]) == set(held[:100])
    assert order(ctx(nc, run), held[:100])["n_rows"] == 100
    from flower_vfl.io.psi_log import FILE
    import sqlite3
    db = sqlite3.connect(str(Path(nc["state-dir"]) / FILE))
    assert db.execute("SELECT DISTINCT run FROM answers").fetchall() == [(str(run),)]
    db.close()
