"""The moment route through Flower (issue 21 item 3; docs/privacy_parties.md, "Through Flower").

The real ClientApp handlers (``query.moment_identify``, ``query.moment_release``, ``train.moment``,
``evaluate.moment``) and the real strategy (:class:`~flower_vfl.strategies.moment.MomentStrategy`,
built by the ServerApp's ``make_strategy`` from ``route='moment'``) on an in-process LocalGrid, each
node with its own node config and store, a fresh Context per message in the attack tests:

- (a) the Flower route's model equals the in-process minimizer
  (:func:`~flower_vfl.estimator.moment_route.solve_moment_logistic`) of F on the same released g~
  (read back from each party's store): max |dx| <= 1e-6 and the same held-out decisions, on both
  cross-fitted pools of a9a;
- (b) each party's ledger holds exactly one release, of dp-accounting's epsilon; a replay gets the
  stored answer, and so does a new run asking for the same release (charged once); another target
  is refused (exact text), in the run (replay) and in a new run (budget);
- (c) attacks: no reply carries a training-row score or g~; a bad rho / kappa / fit / target is
  refused with the exact message; training before the release, a non-private party and a party
  whose node config gives no pool refuse; ADMM-only run-config keys and own data are refused;
- (d) a9a, both parties private at epsilon = 1: accuracy >= 0.845 and log-loss <= 0.335 (the
  issue's goal) in one run with fresh noise (in process over 3 seeds 0.8488 +- 0.0006 /
  0.3282 +- 0.0001; through Flower simulations/moment_flower.py).
"""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from _party_handlers import _task_identity  # noqa: F401  (autouse fixture)
from flower_vfl.apps import client as ca
from flower_vfl.apps.server import make_strategy
from flower_vfl.clients import party_moment
from flower_vfl.clients.party_private import party_store
from flower_vfl.clients.source import declared_source
from flower_vfl.config.schema import ConfigError
from flower_vfl.core.moment_sharing import MomentXUpdate
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import labels, party_block
from flower_vfl.privacy.ssp import cross_fit_halves, stacking_target
from flower_vfl.strategies import moment as moment_strategy
from flower_vfl.strategies.exchange import PartyRefused

M = 2
EPS, EPS_A9A, DELTA, C_V, LAM = 20.0, 1.0, 1e-5, 1.5, 3e-4
HANDLERS = {"query.moment_identify": ca.moment_identify, "query.moment_release": ca.moment_release,
            "train.moment": ca.moment_train, "evaluate.moment": ca.moment_evaluate}


def rc(dataset="breast_cancer", **kw):
    return {"dataset": dataset, "num-parties": M, "route": "moment", "party-wait": 0.0, "lam": LAM, **kw}


def nodes(tmp_path, eps=EPS, private=True, pool="test", **kw):
    out = {}
    for m in range(M):
        nc = {"partition-id": m, "state-dir": str(tmp_path / f"party{m}")}
        if private:
            nc.update({"dp": True, "dp-epsilon": eps, "dp-delta": DELTA, "dp-clip": C_V})
        if pool is not None:
            nc["moment-pool"] = pool
        nc.update(kw)
        out[100 + m] = nc
    return out


def run_flower(run_config, node_configs, run_id=1, on_reply=None):
    st = make_strategy(run_config)
    st.start(grid=LocalGrid(HANDLERS, node_configs, run_config, run_id=run_id, on_reply=on_reply),
             initial_arrays=ArrayRecord(), num_rounds=1, timeout=120)
    return st


def ledger_entries(nc, run_config):
    src = declared_source(nc, run_config, nc["partition-id"])
    return party_store(nc["state-dir"]).entries(src.key)


def stored_g(nc, run_config, run_id):
    """The party's released g~, read back from its own store (what its train handler reads)."""
    src = declared_source(nc, run_config, nc["partition-id"])
    return np.asarray(party_store(nc["state-dir"]).answer(src.key, f"{run_id}/moment", 1, "eval").payload["g_tilde"])


def ctx(nc, run_id=1, run_config=None):
    return Context(run_id=run_id, node_id=7, node_config=dict(nc), state=RecordDict(),
                   run_config=dict(rc() if run_config is None else run_config))


def target(dataset="breast_cancer"):
    y, _ = labels(dataset)
    return stacking_target((y == np.unique(y)[1]).astype(float), C_V)


def release_msg(v, rnd=1):
    rd = RecordDict({"vectors": ArrayRecord({"v": Array(np.asarray(v))}), "config": ConfigRecord({"round": rnd})})
    return Message(rd, dst_node_id=7, message_type="query.moment_release")


def train_msg(c, kind="train", **cfg):
    config = {"round": 1, "fit": 0, "rho": 1e-3, "lam": LAM, "kappa": target()[1], **cfg}
    rd = RecordDict({"vectors": ArrayRecord({"c": Array(np.asarray(c))}), "config": ConfigRecord(config)})
    return Message(rd, dst_node_id=7, message_type=f"{kind}.moment")


def n_pool(dataset="breast_cancer", fit=0):
    return cross_fit_halves(party_block(dataset, 0, M)[1].shape[0])[fit].size


def refusal(reply):
    assert "refusal" in reply.content.config_records, reply.content
    return reply.content.config_records["refusal"]


# ------------------------------------------------------------------ one a9a run, both private at epsilon = 1
@pytest.fixture(scope="module")
def a9a_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("a9a")
    ncs = nodes(tmp, eps=EPS_A9A)
    replies = []
    st = run_flower(rc("a9a", **{"max-rounds": 60}), ncs, run_id=5,
                    on_reply=lambda msg, rep: replies.append((msg, rep)))
    return st, ncs, replies


def test_flower_model_is_the_in_process_minimizer_on_the_same_release(a9a_run):
    """(a) x of each party (replayed from the target it was last sent) and the intercept equal
    solve_moment_logistic's on the same g~ (each party's stored release), on both pools."""
    from flower_vfl.estimator.moment_route import solve_moment_logistic
    st, ncs, _ = a9a_run
    blocks = [party_block("a9a", m, M) for m in range(M)]
    y, _ = labels("a9a")
    t = (y == np.unique(y)[1]).astype(float)
    pi, kappa = float(t.mean()), stacking_target(t, C_V)[1]
    g = {nc["partition-id"]: stored_g(nc, rc("a9a"), 5) for nc in ncs.values()}
    assert all(len(ledger_entries(nc, rc("a9a"))) == 1 for nc in ncs.values())
    h = [g[m] / (kappa * t.size) for m in range(M)]
    halves = cross_fit_halves(blocks[0][1].shape[0])
    assert st.halves_[0].tolist() == halves[0].tolist()
    f_ref = np.empty(halves[0].size + halves[1].size)
    for fit in (0, 1):
        pool = [normalize_rows(b[1][halves[fit]]) for b in blocks]
        xs_ref, b_ref = solve_moment_logistic(pool, h, pi, LAM)
        ups = [MomentXUpdate(pool[m], h[m], LAM) for m in range(M)]
        xs = [ups[m].solve(st.targets_[fit][m], st.rho_[fit] * M) for m in range(M)]
        b = st.intercepts_[fit] - sum(float(u.mu @ x) for u, x in zip(ups, xs))
        dx = max(float(np.max(np.abs(a - r))) for a, r in zip(xs, xs_ref))
        print(f"fit {fit}: {st.rounds_[fit]} rounds, max |dx| = {dx:.2e}, |db| = {abs(b - b_ref):.2e}")
        assert dx <= 1e-6 and abs(b - b_ref) <= 1e-6
        other = halves[1 - fit]
        f_ref[other] = b_ref + sum(np.asarray(normalize_rows(blk[1][other]) @ x).ravel()
                                   for blk, x in zip(blocks, xs_ref))
    np.testing.assert_allclose(st.decision_test_, f_ref, rtol=0, atol=1e-6)


def test_flower_rounds_are_the_in_process_rounds(a9a_run):
    """(a) one round loop: the Flower route's fits and core.moment_sharing.moment_sharing_admm both
    run core.rounds.RoundDriver (pool_driver); on the same g~, rho and rounds they give the same
    targets, hence x, intercept and held-out decisions, bitwise."""
    from flower_vfl.core.moment_sharing import moment_sharing_admm
    st, ncs, _ = a9a_run
    blocks = [party_block("a9a", m, M) for m in range(M)]
    y, _ = labels("a9a")
    t = (y == np.unique(y)[1]).astype(float)
    kappa = stacking_target(t, C_V)[1]
    g = {nc["partition-id"]: stored_g(nc, rc("a9a"), 5) for nc in ncs.values()}
    h = [g[m] / (kappa * t.size) for m in range(M)]
    halves = cross_fit_halves(blocks[0][1].shape[0])
    f = np.empty(st.decision_test_.size)
    for fit in (0, 1):
        pool = [normalize_rows(b[1][halves[fit]]) for b in blocks]
        xs, b, rounds = moment_sharing_admm(pool, h, float(t.mean()), LAM, rho=st.rho_[fit],
                                            max_rounds=st.max_rounds, tol=st.tol)
        assert rounds == st.rounds_[fit]
        ups = [MomentXUpdate(pool[m], h[m], LAM) for m in range(M)]
        for m in range(M):
            assert np.array_equal(ups[m].solve(st.targets_[fit][m], st.rho_[fit] * M), xs[m])
        assert st.intercepts_[fit] - sum(float(u.mu @ x) for u, x in zip(ups, xs)) == b
        other = halves[1 - fit]
        rows = [normalize_rows(blk[1][other]) for blk in blocks]
        f[other] = sum(ups[m].scores(xs[m], rows[m]) for m in range(M)) + st.intercepts_[fit]
    assert np.array_equal(st.decision_test_, f)
    rows = [r for r in st.history_ if r["fit"] == 1]
    assert [r["fit_round"] for r in rows] == list(range(1, st.rounds_[1] + 1))
    assert [r["round"] for r in st.history_] == list(range(1, sum(st.rounds_) + 1))


def test_a9a_both_private_at_epsilon_1_reach_the_goal_through_flower(a9a_run):
    """(d) the issue's goal through the real handlers, one run with fresh (OS-entropy) noise."""
    st, _, _ = a9a_run
    acc, loss = st.metrics_["test_accuracy"], st.metrics_["test_loss"]
    print(f"a9a, both private at epsilon=1, moment route through Flower: accuracy {acc:.4f}, log-loss {loss:.4f}, "
          f"rounds {st.rounds_}")
    assert acc >= 0.845 and loss <= 0.335, st.metrics_


def test_each_ledger_holds_one_release_of_dp_accountings_epsilon(a9a_run):
    """(b) one Gaussian release per party, charged under "<run>/moment", epsilon = dp-accounting's."""
    import dp_accounting
    st, ncs, _ = a9a_run
    for nc in ncs.values():
        (entry,) = ledger_entries(nc, rc("a9a"))
        assert entry.unit == "moment:row" and entry.run == "5/moment"
        ref = float(dp_accounting.get_epsilon_gaussian(entry.noise_multiplier, DELTA))
        assert st.privacy_[nc["partition-id"]]["totals"]["exact"] == pytest.approx(ref, rel=1e-9)
        assert EPS_A9A * (1 - 1e-5) <= ref <= EPS_A9A * (1 + 1e-9)
        assert entry.sigma == pytest.approx(entry.noise_multiplier * 2 * C_V)


def test_the_server_never_gets_a_training_row_score_or_the_moment(a9a_run):
    """(c) every reply of the run: pool or evaluation-row scores (one value per held-out row of a
    half), an acknowledgement, a report; never an array of a training row's length or g~."""
    st, ncs, replies = a9a_run
    n_train = party_block("a9a", 0, M)[0].shape[0]
    halves = {h.size for h in cross_fit_halves(party_block("a9a", 0, M)[1].shape[0])}
    g = [stored_g(nc, rc("a9a"), 5) for nc in ncs.values()]
    kinds = set()
    for msg, rep in replies:
        kinds.add(msg.metadata.message_type)
        assert not rep.has_error() and "refusal" not in rep.content.config_records
        for name, rec in rep.content.array_records.items():
            for key, arr in rec.items():
                a = arr.numpy()
                assert key in ("s_pool", "s_eval") and a.ndim == 1 and a.size in halves and a.size != n_train
                assert not any(a.size == gm.size and np.allclose(a, gm) for gm in g)
        for rec in rep.content.config_records.values():
            text = json.dumps(dict(rec))
            assert "g_tilde" not in text and all(f"{v:.6g}" not in text for gm in g for v in gm[:3])
    assert kinds == set(HANDLERS)


# ------------------------------------------------------------------ (b) replay, second run
def test_replay_other_target_and_second_run(tmp_path):
    nc = nodes(tmp_path)[100]
    v, kappa = target()
    first = ca.moment_release(release_msg(v), ctx(nc, run_id=1))
    again = ca.moment_release(release_msg(v), ctx(nc, run_id=1))      # a fresh Context: only the store remembers
    assert first.content.array_records == {} and again.content.metric_records["meta"]["released"] == 1
    (entry,) = ledger_entries(nc, rc())
    # training reads the stored release (a fresh Context per message): the same answer twice
    c = np.linspace(-1, 1, n_pool())
    s1 = ca.moment_train(train_msg(c), ctx(nc)).content.array_records["release"]["s_pool"].numpy()
    s2 = ca.moment_train(train_msg(c), ctx(nc)).content.array_records["release"]["s_pool"].numpy()
    assert np.array_equal(s1, s2) and len(ledger_entries(nc, rc())) == 1
    ref = refusal(ca.moment_release(release_msg(v * 0.5), ctx(nc, run_id=1)))
    assert ref["code"] == "replay" and ref["reason"] == (
        "party 0 already answered round 1 with another target; a second answer would reveal the noise, so it is "
        "refused")
    # a new run asking for the same release (a re-run after a crash) gets the stored draw, charged once
    again = ca.moment_release(release_msg(v), ctx(nc, run_id=2))
    assert again.content.metric_records["meta"]["released"] == 1 and len(ledger_entries(nc, rc())) == 1
    s3 = ca.moment_train(train_msg(c), ctx(nc, run_id=2)).content.array_records["release"]["s_pool"].numpy()
    assert np.array_equal(s1, s3)                          # the same g~ behind run 2's rounds
    # another target in a new run is another release: past the budget, refused before any charge
    ref = refusal(ca.moment_release(release_msg(v * 0.5), ctx(nc, run_id=4)))
    assert ref["code"] == "budget" and "above the budget ε=20" in ref["reason"], ref["reason"]
    assert len(ledger_entries(nc, rc())) == 1
    # through the strategy: party 0 is asked for another target (another clip in its node config): its
    # budget is spent, so it refuses, nothing charged. Party 1 (a fresh ledger) made its release: stored,
    # a re-run that asks for it again gets it free
    ncs = nodes(tmp_path)
    ncs[100]["dp-clip"] = 1.0
    with pytest.raises(PartyRefused, match=r"^party 0 refused: party 0 refuses the eval release for round 1 .*above "
                                           r"the budget ε=20\b"):
        run_flower(rc(), ncs, run_id=3)
    assert [len(ledger_entries(n, rc())) for n in ncs.values()] == [1, 1]


# ------------------------------------------------------------------ (c) attacks through the handlers
@pytest.mark.parametrize("bad, field, reason", [
    ({"rho": 1e300}, "config.rho", "party 0: config['rho']=1e+300 is outside the range this party accepts "
                                    "[1e-12, 1e+06]; refused"),
    ({"rho": float("nan")}, "config.rho", "party 0: config['rho']=nan is outside the range this party accepts "
                                           "[1e-12, 1e+06]; refused"),
    ({"lam": 0.0}, "config.lam", "party 0: config['lam']=0.0 is outside the range this party accepts [1e-12, 1000]; "
                                 "refused"),
    ({"kappa": 1e9}, "config.kappa", "party 0: config['kappa']=1000000000.0; expected c_v / max(pi, 1 - pi), in "
                                     "(1.5, 3] for this party's clip c_v=1.5"),
    ({"fit": 2}, "config.fit", "party 0: config['fit']=2; expected 0 or 1 (which half of the held-out rows is the "
                               "pool)"),
    ({"round": 0}, "config.round", "party 0: config['round']=0; expected an integer 1..100000"),
    ("short", "vectors.c", "party 0: vectors['c'] has shape (70,); expected (71,) (one value per pool row)"),
    ("nan", "vectors.c", "party 0: vectors['c'] holds NaN or inf values"),
    ("huge", "vectors.c", "party 0: vectors['c'] holds values beyond +-1e+06"),
])
def test_a_bad_round_message_is_refused_with_its_message(tmp_path, bad, field, reason):
    nc = nodes(tmp_path)[100]
    v, _ = target()
    ca.moment_release(release_msg(v), ctx(nc))
    n = n_pool()
    c = np.zeros(n)
    if bad == "short":
        c = c[:-1]
    elif bad == "nan":
        c[3] = np.nan
    elif bad == "huge":
        c[3] = 1e7
    for kind, handler in (("train", ca.moment_train), ("evaluate", ca.moment_evaluate)):
        ref = refusal(handler(train_msg(c, kind, **(bad if isinstance(bad, dict) else {})), ctx(nc)))
        assert (ref["code"], ref["field"], ref["reason"]) == ("invalid", field, reason)
    assert len(ledger_entries(nc, rc())) == 1


def test_node_config_rho_limits_and_release_first(tmp_path):
    nc = nodes(tmp_path, **{"max-rho": 0.5})[100]
    c = np.zeros(n_pool())
    ref = refusal(ca.moment_train(train_msg(c), ctx(nc)))
    assert ref["reason"] == ("party 0 has not made its moment release in run 1; send query.moment_release first "
                             "(nothing is computed before it)")
    ca.moment_release(release_msg(target()[0]), ctx(nc))
    ref = refusal(ca.moment_train(train_msg(c, rho=1.0), ctx(nc)))
    assert ref["reason"] == "party 0: config['rho']=1.0 is outside the range this party accepts [1e-12, 0.5]; refused"
    assert "release" in ca.moment_train(train_msg(c, rho=0.5), ctx(nc)).content.array_records
    # a bad target for the release: refused before any charge
    ref = refusal(ca.moment_release(release_msg(np.zeros(3)), ctx(nc, run_id=9)))
    assert ref["code"] == "invalid" and ref["field"] == "vectors.v"


def test_evaluation_scores_held_out_rows_only(tmp_path):
    """evaluate.moment scores the other half of the held-out rows with the x the target gives."""
    nc = nodes(tmp_path)[100]
    v, kappa = target()
    ca.moment_release(release_msg(v), ctx(nc))
    D, D_test = party_block("breast_cancer", 0, M)
    h0, h1 = cross_fit_halves(D_test.shape[0])
    c = np.linspace(-1, 1, h0.size)
    got = ca.moment_evaluate(train_msg(c, "evaluate"), ctx(nc)).content.array_records["release"]["s_eval"].numpy()
    g = stored_g(nc, rc(), 1)
    upd = MomentXUpdate(normalize_rows(D_test[h0]), g / (kappa * D.shape[0]), LAM)
    x = upd.solve(c, 1e-3)
    np.testing.assert_allclose(got, normalize_rows(D_test[h1]) @ x - upd.mu @ x, rtol=1e-12, atol=1e-12)
    assert got.shape == (h1.size,)


def test_a_non_private_party_and_a_party_without_a_pool_refuse(tmp_path):
    nc = nodes(tmp_path, private=False)[100]
    ref = refusal(ca.moment_release(release_msg(target()[0]), ctx(nc)))
    assert "is not private" in ref["reason"] and "route='admm'" in ref["reason"]
    with pytest.raises(PartyRefused, match="is not private"):
        run_flower(rc(), nodes(tmp_path, private=False))
    for pool in (None, "none"):
        ncs = nodes(tmp_path / str(pool), pool=pool)
        ref = refusal(ca.moment_release(release_msg(target()[0]), ctx(ncs[100])))
        assert ref["reason"].startswith("party 0: its node config does not let its held-out rows serve as the "
                                        "unlabelled pool (moment-pool='none')")
        assert ledger_entries(ncs[100], rc()) == []
        with pytest.raises(PartyRefused, match="does not let its held-out rows serve as the unlabelled pool"):
            run_flower(rc(), ncs)
    # the run config cannot give the pool (a node-config key)
    with pytest.raises(ConfigError, match="'moment-pool' can only be set in a SuperNode's node config"):
        make_strategy(rc(**{"moment-pool": "test"}))


def test_run_config_keys_of_the_route(tmp_path):
    with pytest.raises(ConfigError, match=r"run config key 'alpha'=1.5 is refused with route='moment': it sets the "
                                          r"ADMM route, which this run does not use \(each private party makes one "
                                          r"moment release"):
        make_strategy(rc(alpha=1.5))
    with pytest.raises(ConfigError, match="run config key 'lam'=0.0 is refused with route='moment'"):
        make_strategy(rc(lam=0.0))
    with pytest.raises(ConfigError, match="route='moment' runs on a bundled dataset only"):
        make_strategy(rc(**{"labels-path": "/tmp/l.csv"}))
    with pytest.raises(ConfigError, match="'dp-epsilon'=100.0 is refused"):
        make_strategy(rc(**{"dp-epsilon": 100.0}))
    st = make_strategy(rc(rho=1e-3, **{"max-rounds": 7, "tol": 1e-9}))
    assert (st.lam, st.rho, st.max_rounds, st.tol) == (LAM, 1e-3, 7, 1e-9)
    # a party never reads privacy from the run config
    nc = nodes(tmp_path)[100]
    loose = rc(**{"dp-epsilon": 100.0, "dp-clip": 1000.0, "dp": False})
    rep = ca.moment_release(release_msg(target()[0]), ctx(nc, run_config=loose))
    report = json.loads(rep.content.config_records["privacy"]["report"])
    assert report["config"]["epsilon"] == EPS and report["config"]["c_v"] == C_V
    assert party_moment.POOL_SEED == moment_strategy.POOL_SEED
