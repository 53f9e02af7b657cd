"""A party's budget belongs to the people in its data (issue 20): a malicious central node
against the real ClientApp handlers, with a fresh Flower ``Context`` per run.

The ledger is keyed by what the party's node config declares (its file and ID column, or a
bundled dataset and partition), so no ``num-parties``, PSI row order, subset or run resets it;
the run config cannot name the party's files; the party never draws noise from a seed; and
a crafted ρ is refused before anything is charged.
"""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.config.schema import ConfigError
from flower_vfl.io import psi
from flower_vfl.io.bundled import write_table
from flower_vfl.privacy import epsilon_for_releases, noise_multiplier_for
from flower_vfl.privacy.store import PartyStore

from _party_handlers import DELTA, N, RC, _task_identity  # noqa: F401  (_task_identity: autouse)


def ctx(node_config, run_id, run_config=None):
    """A fresh Context, as a SuperNode keeps one per run."""
    return Context(run_id=run_id, node_id=7, node_config=dict(node_config), state=RecordDict(),
                   run_config=dict(RC if run_config is None else run_config))


def send(handler, context, rd, kind):
    return handler(Message(rd, dst_node_id=7, message_type=kind), context)


def identify(context):
    return send(ca.identify, context, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")


def train(context, rnd, n, rho=1e-3, seed=0):
    rng = np.random.default_rng(seed)
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": rho, "alpha": 1.0, "theta": 0.5}),
                     "vectors": ArrayRecord({"q": Array(rng.normal(size=n) * 0.1),
                                             "y": Array(rng.normal(size=n) * 1e-4)})})
    return send(ca.train, context, rd, "train")


def refusal(reply):
    assert "refusal" in reply.content, f"expected a refusal, got {list(reply.content.keys())}"
    return dict(reply.content["refusal"])


def sources(state_dir):
    store = PartyStore(state_dir)
    return {src: store.entries(src) for src, _ in store.sources()}


def private_node(tmp_path, **kw):
    """A private party whose runs here are left unfinished one after another (the server's new views):
    ``dp-plan-expiry=0`` lets an unfinished run's reservation lapse at once, so what decides a new run
    is the ledger alone: its whole plan must fit in what the releases of every view left
    (reservations: tests/test_failure_budget.py)."""
    cfg = {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "dp-train-rounds": 2, "dp-eval-rounds": 0,
           "state-dir": str(tmp_path / "party1"), "dp-plan-expiry": 0.0}
    cfg.update(kw)
    return cfg


# ------------------------------------------------------------------ num-parties
def test_another_num_parties_is_the_same_people_and_the_same_ledger(tmp_path):
    """Each num-parties gives the party another column block of the same rows: before, each was a
    fresh budget (11 on a9a); now every run composes in one ledger: after one release of run 1, the
    plan of run 2 (num-parties 3) and of run 3 (5) no longer fits and each is refused before any
    release (before, run 2 released and failed half-way: budget spent, no model)."""
    nc = private_node(tmp_path)
    z = noise_multiplier_for(1.0, DELTA, 2)
    assert "release" in train(ctx(nc, 1, {**RC, "num-parties": 2}), 1, N).content
    info = dict(identify(ctx(nc, 2, {**RC, "num-parties": 3})).content["identity"])
    assert info["spent_before_run"] == pytest.approx(epsilon_for_releases([z], DELTA), rel=1e-9)
    assert info["affordable"] is False                  # 1 spent + a plan of 2 > a budget of 2 releases
    for run, n in ((2, 3), (3, 5)):
        rep = refusal(train(ctx(nc, run, {**RC, "num-parties": n}), 1, N))
        assert rep["code"] == "budget" and rep["reason"] == (
            f"party 1 refuses run {run}: its plan of 2 release(s) would bring its total to ε=1.25, above the budget "
            "ε=1 (δ=1e-05, method='exact'); already spent ε=0.6841 over 1 release(s)")
    (src, entries), = sources(nc["state-dir"]).items()
    assert '"dataset":"breast_cancer"' in src and '"partition-id":1' in src
    assert [e.run for e in entries] == ["1"]
    assert epsilon_for_releases([e.noise_multiplier for e in entries], DELTA) == pytest.approx(0.6841, abs=1e-4)


# ------------------------------------------------------------------ PSI order
@pytest.fixture
def own_file(tmp_path):
    rng = np.random.default_rng(5)
    n = 300
    ids = [f"p{i:04d}" for i in range(n)]
    X = rng.normal(size=(n, 6))
    path = write_table(tmp_path / "bank.csv", ids, X, [f"f{j}" for j in range(6)], "csv")
    return path, ids


def psi_order(context, order):
    rd = RecordDict({"psi": ConfigRecord({"split": "train", "order": psi.encode_ids(order),
                                          "digest": psi.ids_digest(order)})})
    return send(ca.psi_party.psi_order, context, rd, "query.psi_order")


def test_a_permuted_or_one_short_psi_order_is_the_same_ledger(tmp_path, own_file):
    """The server reshapes the aligned block (a permutation, one row fewer, preprocessing): before,
    each gave a fresh budget (18 on a9a, true ε 4.75 against 1); now all are one source: after run 1's
    release, no other view's plan of 3 fits, each refused naming what the source already spent."""
    path, ids = own_file
    nc = private_node(tmp_path, **{"data-path": str(path), "dp-train-rounds": 3})
    rng = np.random.default_rng(0)
    orders = [ids, list(rng.permutation(ids)), ids[:-1], list(rng.permutation(ids[1:]))]
    replies = []
    for run, order in enumerate(orders, start=1):
        c = ctx(nc, run, {"num-parties": 2, "lam": 1e-2})
        psi_order(c, order)
        replies.append(train(c, 1, len(order)))
    assert ["release" in r.content for r in replies] == [True, False, False, False]
    for run, r in enumerate(replies[1:], start=2):
        assert refusal(r)["code"] == "budget" and refusal(r)["reason"] == (
            f"party 1 refuses run {run}: its plan of 3 release(s) would bring its total to ε=1.171, above the budget "
            "ε=1 (δ=1e-05, method='exact'); already spent ε=0.5483 over 1 release(s)")
    (src, entries), = sources(nc["state-dir"]).items()
    assert src == '{"data-path":"%s","id-column":"id","kind":"files"}' % path.resolve()
    z = noise_multiplier_for(1.0, DELTA, 3)
    assert [e.noise_multiplier for e in entries] == pytest.approx([z], rel=1e-12)


# ------------------------------------------------------------------ run-config file keys
@pytest.mark.parametrize("key, value", [
    ("party-data-paths", "/etc/passwd,/tmp/other.csv"), ("party-test-paths", "a.csv,b.csv"),
    ("party-score-paths", "a.csv,b.csv"), ("party-model-dirs", "/tmp/x,/tmp/y"),
    ("preprocess", "standardize"), ("id-column", "income")])
def test_a_run_config_naming_the_partys_files_is_refused_at_identify(tmp_path, key, value):
    nc = private_node(tmp_path)
    with pytest.raises(ConfigError, match=rf"party 1: run config key '{key}'=.* is refused: only a party's own "
                                          "node config names its files"):
        identify(ctx(nc, 1, {**RC, key: value}))
    assert sources(nc["state-dir"]) == {}
    identify(ctx(nc, 1, {**RC, key: {"preprocess": "none", "id-column": "id"}.get(key, "")}))   # the defaults


def test_the_label_owners_id_column_may_stay_once_the_party_declares_its_own(tmp_path, own_file):
    path, ids = own_file
    nc = private_node(tmp_path, **{"data-path": str(path), "id-column": "id"})
    c = ctx(nc, 1, {"num-parties": 2, "lam": 1e-2, "id-column": "customer"})
    psi_order(c, ids)
    assert "release" in train(c, 1, len(ids)).content


def test_a_party_that_declares_no_data_in_an_own_data_run_refuses_to_start(tmp_path):
    nc = {"partition-id": 1, "state-dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="party 1 declares no data: its node config has no 'data-path', and "
                                          r"this run \(labels-path='/srv/owner.csv'\) is an own-data run"):
        identify(ctx(nc, 1, {**RC, "labels-path": "/srv/owner.csv"}))


def test_flowers_simulation_node_config_serves_a_bundled_dataset(tmp_path):
    """What Flower's simulation engine gives a node: partition-id and num-partitions, nothing else."""
    nc = {"partition-id": 1, "num-partitions": 2}
    info = dict(identify(ctx(nc, 1)).content["identity"])
    assert info["party"] == 1 and info["n_rows"] == N


# ------------------------------------------------------------------ no seed
def test_a_party_never_draws_reproducible_noise(tmp_path):
    """Two runs with identical inputs at the same round (the A - B attack of issue 20): the
    x-updates are equal, the releases differ by two independent noise draws. Run B is answered by
    a state folder of its own (a second ledger on the same data, e.g. a reset one: the only way a
    second run gets a release once run A's plan holds the budget)."""
    with pytest.raises(ConfigError, match="node config key 'dp-seed'=5 is refused"):
        identify(ctx(private_node(tmp_path, **{"dp-seed": 5}), 1))
    nodes = [private_node(tmp_path / name, **{"dp-epsilon": 20.0}) for name in ("a", "b")]
    a, b = (train(ctx(nc, run, RC), 1, N, seed=1) for nc, run in zip(nodes, (1, 2)))
    sa, sb = (r.content["release"]["s"].numpy() for r in (a, b))
    ((_, (ea,)),), ((_, (eb,)),) = (sources(nc["state-dir"]).items() for nc in nodes)
    assert ea.sigma == eb.sigma
    assert np.std(sa - sb) / (np.sqrt(2) * ea.sigma) == pytest.approx(1.0, abs=0.15)       # e_A - e_B, not 0
    xa, xb = (PartyStore(nc["state-dir"]).get_state(src, str(run))["x"]
              for nc, run in zip(nodes, (1, 2)) for (src, _) in PartyStore(nc["state-dir"]).sources())
    assert np.array_equal(xa, xb)


# ------------------------------------------------------------------ range checks
@pytest.mark.parametrize("rho", [1e300, 1.7e308])
def test_a_crafted_rho_is_refused_before_any_charge(tmp_path, rho):
    nc = private_node(tmp_path)
    rep = refusal(train(ctx(nc, 1), 1, N, rho=rho))
    assert rep["code"] == "invalid" and rep["field"] == "config.rho" and "nothing charged" in rep["reason"]
    assert sources(nc["state-dir"]) == {} or all(v == [] for v in sources(nc["state-dir"]).values())
    assert "release" in train(ctx(nc, 1), 1, N).content       # the same round, a sane rho: answered


def test_the_partys_own_rho_bounds_are_enforced(tmp_path):
    nc = private_node(tmp_path, **{"min-rho": 1e-4, "max-rho": 1e-2})
    for rho in (1e-5, 0.5):
        rep = refusal(train(ctx(nc, 1), 1, N, rho=rho))
        assert rep["field"] == "config.rho" and "min-rho / max-rho" in rep["reason"]
    assert all(v == [] for v in sources(nc["state-dir"]).values())
    assert "release" in train(ctx(nc, 1), 1, N, rho=1e-4).content        # the bounds are inclusive
    with pytest.raises(ConfigError, match="min-rho=0.1 is above max-rho=0.01"):
        identify(ctx(private_node(tmp_path, **{"min-rho": 0.1, "max-rho": 0.01}), 1))
