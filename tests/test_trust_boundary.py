"""A malicious central node against the party's real ClientApp handlers.

Every test drives ``flower_vfl.apps.client``'s handlers with a Flower ``Context`` as a
SuperNode keeps it (node config, per-run state) and the party's own state-dir, and plays
a server that replays, crafts inputs, rewrites the run config, starts new runs and sends
garbage. What must hold: no second noise draw for an answered request, no privacy setting
taken from the run config, no seed in any reply, the budget shared by every run on the
data, nothing charged for an invalid request.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.io.data import party_block
from flower_vfl.privacy.store import PartyStore

N = party_block("breast_cancer", 1, 2)[0].shape[0]


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
RC = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}


def node(tmp_path, **kw):
    cfg = {"partition-id": 1, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 3, "dp-eval-rounds": 1,
           "state-dir": str(tmp_path / "party1")}
    cfg.update(kw)
    return cfg


def ctx(node_config, run_id=1, run_config=None):
    return Context(run_id=run_id, node_id=7, node_config=dict(node_config), state=RecordDict(),
                   run_config=dict(RC if run_config is None else run_config))


def content(rnd, q=None, y=None, rho=1e-3, alpha=1.0, theta=0.5, **extra):
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": rho, "alpha": alpha, "theta": theta, **extra})})
    if q is not None:
        rd["vectors"] = ArrayRecord({"q": Array(np.asarray(q)), "y": Array(np.asarray(y))})
    return rd


def send(handler, context, rd, kind="train"):
    return handler(Message(rd, dst_node_id=7, message_type=kind), context)


def train(context, rnd, q, y, **kw):
    return send(ca.train, context, content(rnd, q, y, **kw))


def vectors(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=N) * 0.1, rng.normal(size=N) * 1e-4


def ledger(node_config):
    store = PartyStore(node_config["state-dir"])
    return [e for src, _ in store.sources() for e in store.entries(src)]


def refusal(reply):
    assert "refusal" in reply.content, f"expected a refusal, got {list(reply.content.keys())}"
    return dict(reply.content["refusal"])


def s_of(reply):
    return reply.content["release"]["s"].numpy()


# --------------------------------------------------------------------------- replay
def test_replay_with_crafted_inputs_is_refused_and_identical_resend_is_the_same_vector(tmp_path):
    nc = node(tmp_path)
    c = ctx(nc)
    q, y = vectors()
    first = s_of(train(c, 1, q, y))
    assert np.array_equal(s_of(train(c, 1, q, y)), first)            # re-sent: the stored answer
    crafted = train(c, 1, q, np.zeros(N) + 1e-12)                     # the v = 0 attack of the issue
    assert refusal(crafted)["code"] == "replay"
    assert "already answered the train request of round 1 with other inputs" in refusal(crafted)["reason"]
    train(c, 3, q, y)
    older = refusal(train(c, 2, q, y))                                # never answered, but older
    assert older["code"] == "replay" and "round numbers must increase" in older["reason"]
    assert [e.round for e in ledger(nc)] == [1, 3]


def test_evaluation_replay_serves_the_one_released_model(tmp_path):
    nc = node(tmp_path, **{"dp-train-rounds": 0})
    c = ctx(nc)
    q, y = vectors()
    first = send(ca.evaluate, c, content(5, q, y, final_update=True), "evaluate")
    s1 = first.content["release"]["s_test"].numpy()
    for rnd, qq in ((5, q * 3), (6, -q), (7, None)):                  # crafted final updates, plain asks
        extra = {"final_update": True} if qq is not None else {}
        rep = send(ca.evaluate, c, content(rnd, qq, y if qq is not None else None, **extra), "evaluate")
        assert np.array_equal(rep.content["release"]["s_test"].numpy(), s1)
    assert [(e.kind, e.round) for e in ledger(nc)] == [("eval", 5)]


def test_evaluation_before_the_final_update_is_refused_without_charge(tmp_path):
    nc = node(tmp_path)
    c = ctx(nc)
    rep = send(ca.evaluate, c, content(1), "evaluate")
    assert refusal(rep)["code"] == "refused" and "releases its model once" in refusal(rep)["reason"]
    assert ledger(nc) == []


# ------------------------------------------------------------------ run config
@pytest.mark.parametrize("override", [
    {"dp": False}, {"dp-parties": "0"}, {"dp-seed": 42}, {"dp-delta": 0.5}, {"dp-noise": "paper"},
    {"dp-calibration": "paper"}, {"dp-epsilon": 50.0}, {"dp-train-rounds": 50}, {"dp-clip": 1e-6},
    {"dp-b1": 1e-6}, {"dp-lam": 10.0}, {"dp-accountant": "paper"}])
def test_run_config_privacy_keys_have_no_effect(tmp_path, override):
    q, y = vectors()
    base_nc = node(tmp_path / "base")
    base = train(ctx(base_nc), 1, q, y)
    nc = node(tmp_path / "attacked")
    rep = train(ctx(nc, run_config={**RC, "dp": True, **override}), 1, q, y)
    assert "release" in rep.content                                    # still private, still answering
    report = json.loads(str(rep.content["privacy"]["report"]))
    want = json.loads(str(base.content["privacy"]["report"]))
    assert report["config"] == want["config"] and report["noise_multiplier"] == want["noise_multiplier"]
    assert report["ledger"]["entries"] == want["ledger"]["entries"]    # same sigma, same sensitivity
    assert "noise_source" not in report["config"] and "seed" not in report["config"]


def test_run_config_asking_for_privacy_without_a_node_budget_refuses_to_start(tmp_path):
    from flower_vfl.config.schema import ConfigError

    c = ctx({"partition-id": 1, "state-dir": str(tmp_path)}, run_config={**RC, "dp": True, "dp-epsilon": 1.0})
    with pytest.raises(ConfigError, match="its node config declares no budget.*dp-epsilon"):
        send(ca.identify, c, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")


def test_a_party_refuses_a_noise_seed_and_its_replies_say_nothing_of_the_noise(tmp_path):
    from flower_vfl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="node config key 'dp-seed'=918273645 is refused: a party draws its noise "
                                          "from OS entropy only"):
        send(ca.identify, ctx(node(tmp_path, **{"dp-seed": 918273645})),
             RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")
    c = ctx(node(tmp_path, **{"dp-seed": -1}))             # -1 is "no seed": accepted
    q, y = vectors()
    replies = [send(ca.identify, c, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify"),
               train(c, 1, q, y), train(c, 1, q * 2, y), train(c, 2, q, y),
               send(ca.evaluate, c, content(9, q, y, final_update=True), "evaluate")]
    for rep in replies:
        text = json.dumps({name: {k: str(v) for k, v in rec.items()}
                           for name, rec in rep.content.items() if not isinstance(rec, ArrayRecord)})
        assert "seed" not in text and "noise_source" not in text and "entropy" not in text


# ------------------------------------------------------------- runs and restarts
def test_a_new_run_on_the_same_data_sees_only_what_is_left(tmp_path):
    nc = node(tmp_path, **{"dp-train-rounds": 2, "dp-eval-rounds": 1})
    q, y = vectors()
    c1 = ctx(nc, run_id=1)
    train(c1, 1, q, y)
    train(c1, 2, q, y)
    send(ca.evaluate, c1, content(3, q, y, final_update=True), "evaluate")
    c2 = ctx(nc, run_id=2)                              # a new run: fresh context.state
    ident = send(ca.identify, c2, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")
    info = dict(ident.content["identity"])
    assert info["affordable"] is False and info["spent_before_run"] == pytest.approx(2.0, rel=1e-6)
    rep = refusal(train(c2, 1, q, y))
    assert rep["code"] == "budget" and "above the budget" in rep["reason"]
    assert len(ledger(nc)) == 3


def test_a_restarted_node_resumes_its_iterate_and_ledger(tmp_path):
    q, y = vectors()
    nc = node(tmp_path)
    c = ctx(nc)
    first = s_of(train(c, 1, q, y))
    store = PartyStore(nc["state-dir"])
    (src, _), = store.sources()
    after1 = store.get_state(src, "1")
    c = ctx(nc)                                         # the SuperNode restarted: context.state is gone
    assert np.array_equal(s_of(train(c, 1, q, y)), first)             # the re-sent round: the stored answer
    second = s_of(train(c, 2, q, y))
    # round 2 started from the stored iterate: the same x-update a steady party makes from x1
    from flower_vfl.privacy.party import PrivateParty
    from flower_vfl.config.settings import privacy_from_config
    D = party_block("breast_cancer", 1, 2)[0]
    steady = PrivateParty(D, None, 1e-2, privacy_from_config(1, RC, nc, n_rows=D.shape[0]), party_id=1)
    steady.restore(after1)
    steady.update.step(q, y, 1e-3, 1.0, 0.5)
    assert np.allclose(store.get_state(src, "1")["x"], steady.update.x, rtol=0, atol=1e-12)
    assert not np.array_equal(second, first) and len(ledger(nc)) == 2


def test_an_evaluation_allowance_cannot_be_spent_as_a_training_release(tmp_path):
    nc = node(tmp_path, **{"dp-train-rounds": 0, "dp-eval-rounds": 1})
    rep = refusal(train(ctx(nc), 1, *vectors()))
    assert rep["code"] == "plan" and "allows 0 train release(s) per run" in rep["reason"]
    assert ledger(nc) == []


# ---------------------------------------------------------------- bad messages
N_ = N
BAD = [
    ("config.rho", dict(rho=float("nan"))), ("config.rho", dict(rho=float("inf"))), ("config.rho", dict(rho=-1.0)),
    ("config.rho", dict(rho=0.0)), ("config.theta", dict(theta=0.0)), ("config.theta", dict(theta=3.0)),
    ("config.alpha", dict(alpha=2.0)), ("config.alpha", dict(alpha=float("nan"))),
    ("config.round", dict(rnd=-1)), ("config.round", dict(rnd="1")),
    ("vectors.q", dict(q=np.full(N_, np.nan))), ("vectors.y", dict(y=np.full(N_, np.inf))),
    ("vectors.q", dict(q=np.zeros(N_ + 1))), ("vectors.q", dict(q=np.zeros((N_, 2)))),
    ("vectors.y", dict(y=np.zeros(N_ - 1))), ("vectors.q", dict(q=np.array(["a"] * N_))),
]


def _bad(kw):
    q, y = vectors()
    rnd = kw.pop("rnd", 1)
    q, y = kw.pop("q", q), kw.pop("y", y)
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": 1e-3, "alpha": 1.0, "theta": 0.5, **kw})})
    rd["vectors"] = ArrayRecord({"q": Array(q), "y": Array(y)})
    return rd


@pytest.mark.parametrize("private", [True, False])
def test_invalid_messages_are_refused_naming_the_field_and_change_nothing(tmp_path, private):
    nc = node(tmp_path) if private else {"partition-id": 1, "state-dir": str(tmp_path)}
    clean_nc = node(tmp_path / "clean") if private else {"partition-id": 1}
    c = ctx(nc)
    for field, kw in BAD:
        rep = refusal(send(ca.train, c, _bad(dict(kw))))
        assert rep["code"] == "invalid" and rep["field"] == field, (field, rep)
    for missing in ("vectors", "config"):
        rd = _bad({})
        del rd[missing]
        assert refusal(send(ca.train, c, rd))["field"].startswith("message." if missing else "")
    if private:
        assert ledger(nc) == []                          # nothing charged
    q, y = vectors()
    after = train(c, 1, q, y)                            # a valid message afterwards ...
    clean = train(ctx(clean_nc), 1, q, y)                # ... answers as a party that saw no garbage
    if private:                                          # (fresh noise each: compare the iterate and the charge)
        def state(cfg):
            st = PartyStore(cfg["state-dir"])
            (src, _), = st.sources()
            return st.get_state(src, "1")["x"], [(e.round, e.sigma) for e in st.entries(src)]
        (xa, la), (xc, lc) = state(nc), state(clean_nc)
        assert np.array_equal(xa, xc) and la == lc and len(la) == 1
    else:
        assert np.array_equal(s_of(after), s_of(clean))


def test_a_non_private_party_caps_its_answers_per_run(tmp_path):
    c = ctx({"partition-id": 1, "max-answers": 2})
    q, y = vectors()
    train(c, 1, q, y)
    train(c, 2, q, y)
    rep = refusal(train(c, 3, q, y))
    assert "max-answers" in rep["reason"]


# ---------------------------------------------------------------------- crash
def test_a_crash_between_ledger_write_and_reply_loses_budget_never_privacy(tmp_path):
    """The party process dies right after the release became durable and before it replied;
    the restarted party answers the re-sent request from its store: one row, one draw."""
    nc = node(tmp_path)
    q, y = vectors()
    np.savez(tmp_path / "msg.npz", q=q, y=y)
    script = textwrap.dedent(f"""
        import os, json, numpy as np
        from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
        from flower_vfl.apps import client as ca
        from flower_vfl.privacy import store
        from flwr.supercore.task_identity import TaskIdentity
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
        store._after_commit_hook = lambda: os._exit(17)      # the injected fault
        m = np.load({str(tmp_path / "msg.npz")!r})
        rd = RecordDict({{"config": ConfigRecord({{"round": 1, "rho": 1e-3, "alpha": 1.0, "theta": 0.5}}),
                          "vectors": ArrayRecord({{"q": Array(m["q"]), "y": Array(m["y"])}})}})
        c = Context(run_id=1, node_id=7, node_config=json.loads({json.dumps(json.dumps(nc))}), state=RecordDict(),
                    run_config={json.dumps(RC)!r} and json.loads({json.dumps(json.dumps(RC))}))
        ca.train(Message(rd, dst_node_id=7, message_type="train"), c)
        os._exit(0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr[-2000:]
    entries = ledger(nc)
    assert [(e.run, e.round, e.kind) for e in entries] == [("1", 1, "train")]     # charged
    rep = train(ctx(nc), 1, q, y)                       # the server re-sends after the restart
    store = PartyStore(nc["state-dir"])
    (src, count), = store.sources()
    assert count == 1                                   # no second draw exists
    assert np.array_equal(s_of(rep), store.answer(src, "1", 1, "train").payload["s"])


# ------------------------------------------------------------- predict many
def test_predict_many_times_uses_one_released_model():
    from flower_vfl import VerticalADMM
    from flower_vfl.privacy import PrivacyConfig

    (D0, T0), (D1, T1) = party_block("breast_cancer", 0, 2), party_block("breast_cancer", 1, 2)
    from flower_vfl.io.data import labels
    y, _ = labels("breast_cancer")
    m = VerticalADMM(lam=1e-3, max_rounds=20, privacy=[None, PrivacyConfig(epsilon=1.0, lam=3e-2)]).fit([D0, D1], y)
    outs = [m.decision_function([T0, T1]) for _ in range(3)]
    proba = [m.predict_proba([T0, T1]) for _ in range(2)]
    preds = m.predict([T0, T1])
    assert all(np.array_equal(outs[0], o) for o in outs) and np.array_equal(proba[0], proba[1])
    assert preds.shape == (T0.shape[0],)
    entries = m.privacy_report()[0]["ledger"]["entries"]
    assert [e["kind"] for e in entries] == ["eval"]
    p = m._parties[1]
    assert np.array_equal(m.coef_[1], p.x_released) and not np.allclose(m.coef_[1], p.x)


# ------------------------------------------------- no silent non-privacy, reports
def _grid_run(rc, nodes, seen=None, run_id=1):
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    handlers = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
    grid = LocalGrid(handlers, nodes, rc, on_reply=None if seen is None else (lambda m, r: seen.append((m, r))),
                     run_id=run_id)
    st = sa.make_strategy(rc)
    st.start(grid)
    return st


def test_unknown_party_ids_in_dp_parties_are_an_error():
    from flower_vfl.cli import commands as cli
    from flower_vfl.apps import server as sa
    from flower_vfl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="dp-parties"):
        sa.make_strategy({"dataset": "breast_cancer", "num-parties": 2, "dp": True, "dp-parties": "5"})
    with pytest.raises(SystemExit):
        cli.main(["fit", "--dataset", "breast_cancer", "--dp", "--dp-parties", "5"])


def test_a_private_party_whose_budget_is_spent_stops_the_run_at_identify(tmp_path):
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3}
    nodes = {100: {"partition-id": 0}, 101: node(tmp_path, **{"dp-train-rounds": 0})}
    _grid_run(rc, nodes, run_id=1)                                   # spends the whole budget
    with pytest.raises(Exception, match=r"party 1 \(node 101\) is private and its remaining budget cannot cover"):
        _grid_run(rc, nodes, run_id=2)                               # a new run on the same data


def test_eval_every_never_spends_a_private_release_and_the_report_says_what_is_protected(tmp_path):
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 10, "eval-every": 3}
    # dp-lam = lam (1e-4, the default before it scaled with N): the warning path below
    nodes = {100: {"partition-id": 0}, 101: node(tmp_path, **{"dp-train-rounds": 0, "dp-epsilon": 0.5, "dp-lam": 1e-4})}
    seen = []
    st = _grid_run(rc, nodes, seen)
    to_private = [m.metadata.message_type for m, _ in seen if m.metadata.dst_node_id == 101]
    assert to_private == ["query.identify", "evaluate"]              # asked once, at the end
    assert sum("test_loss_nonprivate" in row for row in st.history_) >= 3
    prot = st.final_["protection"]
    assert prot["1"]["features"].startswith("row-level DP") and prot["0"]["features"].startswith("not protected")
    assert prot["0"]["labels"].startswith("not protected") and prot["1"]["scored_rows"].startswith("not protected")
    # at dp-lam = lam the evaluation noise swamps breast cancer's 426 rows: said after the run
    assert st.final_["test_loss"] > st.nonprivate_reference_["test_loss_nonprivate"]
    assert "made the model worse" in st.final_["dp_warning"]


def test_flower_vfl_ledger_shows_the_spend_across_runs(tmp_path, capsys):
    from flower_vfl.cli import commands as cli

    nc = node(tmp_path, **{"dp-train-rounds": 2, "dp-eval-rounds": 0, "dp-epsilon": 2.0})
    q, y = vectors()
    c1 = ctx(nc, run_id=1)
    ident = send(ca.identify, c1, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")
    token = ident.content["identity"]["plan"]
    train(c1, 1, q, y)
    # run 2 on the same data: a new plan no longer fits (run 1 holds the budget); run 2 is run 1 resumed,
    # presenting its plan token at identify, and continues that plan (its releases stay run 1's)
    c2 = ctx(nc, run_id=2)
    plans = ConfigRecord({"want": "party", "plans": json.dumps({"1": token})})
    assert send(ca.identify, c2, RecordDict({"config": plans}), "query.identify").content["identity"]["continued"]
    train(c2, 2, q, y)
    assert cli.main(["ledger", "--node-config", f"partition-id=1 state-dir='{nc['state-dir']}'", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["sources"]
    assert d["runs"] == {"1": {"train": 2, "eval": 0}}
    from flower_vfl.privacy import epsilon_for_releases, noise_multiplier_for
    z = noise_multiplier_for(2.0, 1e-5, 2, "exact")
    assert d["spent_epsilon"] == pytest.approx(epsilon_for_releases([z, z], 1e-5, "exact"), rel=1e-9)
    assert d["spent_epsilon"] == pytest.approx(2.0, rel=1e-6) and d["remaining_epsilon"] < 1e-6
