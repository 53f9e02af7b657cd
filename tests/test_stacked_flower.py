"""The stacked SSP route through Flower (issue 21 item 2; docs/privacy_parties.md, "Through Flower").

The real ClientApp handlers (``query.ssp_identify``, ``query.ssp_release``) and the real
strategy (:class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy`, built by the ServerApp's
``make_strategy`` from ``route='stacked-ssp'``) on an in-process LocalGrid, each node with its own
node config and store:

- (a) the Flower path's test decisions equal :class:`~flower_vfl.estimator.stacked.StackedPrivateParties`
  in process run on the same released x~ (a ClientApp never draws noise from a seed, issue 20: the
  in-process route replays the party's stored release from its store, so the noise is the same);
  the ledger's epsilon (read from the party's store) equals dp-accounting's for one Gaussian release;
- (b) attacks through the handlers with a fresh Context per message: a replay gets the stored
  answer, and so does a new run asking for the same release (a re-run after a crash: one draw, charged
  once); another target in a new run is charged to the same ledger and refused once the budget is
  spent (naming it); run-config keys naming files or privacy are refused or ignored by
  the party; a non-finite or wrong-length target is refused before any charge; an ADMM release and
  an SSP release of the same party compose in one ledger; a non-private party refuses;
- (c) a9a, both parties private at epsilon = 1: accuracy >= 0.840 and log-loss <= 0.345 in one run
  with fresh noise (OS entropy, no seed). A statistical tolerance, not an average over draws: 80 fresh
  runs of this path measured accuracy 0.8438 +- 0.0012 (min 0.8408) and log-loss 0.3392 +- 0.0015
  (max 0.3420), so the bounds sit 3.2 sd (accuracy) and 3.9 sd (log-loss) from the mean (under a
  normal model of the spread, about 1 run in 1,500 fails).
"""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps.server import make_strategy
from flower_vfl.clients.party_private import party_store
from flower_vfl.clients.source import declared_source
from flower_vfl.config.schema import ConfigError
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import labels, party_block
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.party import PrivacyConfig
from flower_vfl.privacy.ssp import cross_fit_halves, stacking_target
from flower_vfl.strategies.vertical_admm import PartyRefused

M = 2
#: the attack tests run on breast_cancer with epsilon = 20 per party (they check the handlers and the
#: ledger; no calibration); every run that needs the label owner's calibration runs on a9a at epsilon = 1
#: (breast_cancer's 57 pool rows per half do not give a usable calibration reliably, even at epsilon = 20)
EPS, EPS_A9A, DELTA, C_V = 20.0, 1.0, 1e-5, 1.5
HANDLERS = {"query.ssp_identify": ca.ssp_identify, "query.ssp_release": ca.ssp_release}


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def rc(dataset="breast_cancer", **kw):
    return {"dataset": dataset, "num-parties": M, "route": "stacked-ssp", "party-wait": 0.0, **kw}


def nodes(tmp_path, eps=EPS, private=True, **kw):
    out = {}
    for m in range(M):
        nc = {"partition-id": m, "state-dir": str(tmp_path / f"party{m}")}
        if private:
            nc.update({"dp": True, "dp-epsilon": eps, "dp-delta": DELTA, "dp-clip": C_V})
        nc.update(kw)
        out[100 + m] = nc
    return out


def run_flower(run_config, node_configs, run_id=1):
    st = make_strategy(run_config)
    st.start(grid=LocalGrid(HANDLERS, node_configs, run_config, run_id=run_id), initial_arrays=ArrayRecord(),
             num_rounds=1, timeout=120)
    return st


def ledger_entries(nc, run_config):
    src = declared_source(nc, run_config, nc["partition-id"])
    return party_store(nc["state-dir"]).entries(src.key)


def ctx(nc, run_id=1, run_config=None):
    return Context(run_id=run_id, node_id=7, node_config=dict(nc), state=RecordDict(),
                   run_config=dict(rc() if run_config is None else run_config))


def release_msg(v, rnd=1):
    rd = RecordDict({"vectors": ArrayRecord({"v": Array(np.asarray(v))}), "config": ConfigRecord({"round": rnd})})
    return Message(rd, dst_node_id=7, message_type="query.ssp_release")


def target(dataset="breast_cancer"):
    y, _ = labels(dataset)
    return stacking_target((y == np.unique(y)[1]).astype(float), C_V)[0]


def refusal(reply):
    assert "refusal" in reply.content.config_records, reply.content
    return reply.content.config_records["refusal"]


# ------------------------------------------------------------------ (a) the same math as in process
def test_flower_path_equals_the_in_process_route_on_the_same_release(tmp_path, monkeypatch):
    import dp_accounting

    from flower_vfl.estimator import stacked
    from flower_vfl.privacy.ssp import SSPParty
    ncs = nodes(tmp_path, eps=EPS_A9A)
    st = run_flower(rc("a9a"), ncs, run_id=5)
    f_flower = st.decision_test_
    # in process, every party's release replayed from the Flower party's own store (same source, ledger
    # run and target): the same x~, so the same noise; the calibration and scores are recomputed here
    by_party = {nc["partition-id"]: nc for nc in ncs.values()}

    def replaying(D, cfg, ridge, party_id):
        nc = by_party[party_id]
        src = declared_source(nc, rc("a9a"), party_id)
        return SSPParty(D, cfg, ridge=ridge, party_id=party_id, store=party_store(nc["state-dir"]), run="5/ssp",
                        source=src.key, about=src.about)
    monkeypatch.setattr(stacked, "SSPParty", replaying)
    blocks = [party_block("a9a", m, M) for m in range(M)]
    y, _ = labels("a9a")
    cfg = PrivacyConfig(epsilon=EPS_A9A, delta=DELTA, c_v=C_V)
    h0, h1 = cross_fit_halves(blocks[0][1].shape[0])
    rows = lambda idx: [b[1][idx] for b in blocks]  # noqa: E731
    m = stacked.StackedPrivateParties([cfg] * M).fit([b[0] for b in blocks], y, rows(h0))
    f = np.empty(blocks[0][1].shape[0])
    f[h1] = m.decision_function(rows(h1))
    m.calibrate(rows(h1))
    f[h0] = m.decision_function(rows(h0))
    np.testing.assert_allclose(f_flower, f, rtol=0, atol=1e-12)
    # the replay drew nothing: each ledger still holds the one release
    for nc in ncs.values():
        entries = ledger_entries(nc, rc("a9a"))
        assert len(entries) == 1 and entries[0].unit == "ssp:row"
        # its epsilon: one Gaussian release at the entry's noise multiplier, by dp-accounting
        ref = float(dp_accounting.get_epsilon_gaussian(entries[0].noise_multiplier, DELTA))
        assert st.privacy_[nc["partition-id"]]["totals"]["exact"] == pytest.approx(ref, rel=1e-9)
        # at the noise multiplier the party's accountant calibrates for one release at its budget (its
        # root-finder stops within 1e-5 relative of epsilon, from below)
        assert entries[0].noise_multiplier == noise_multiplier_for(EPS_A9A, DELTA, 1, "exact")
        assert EPS_A9A * (1 - 1e-5) <= ref <= EPS_A9A * (1 + 1e-9)
        assert entries[0].sigma == pytest.approx(entries[0].noise_multiplier * math.sqrt(2 + 4 * C_V ** 2))
    # what the label owner saw: held-out scores and one scalar per party, never a training-row score
    assert st.scores_test_.shape == (blocks[0][1].shape[0], M)


# ------------------------------------------------------------------ (b) attacks through the handlers
def test_replay_and_a_re_run_get_the_stored_answer_and_another_target_is_refused_naming_the_budget(tmp_path):
    nc = nodes(tmp_path)[100]
    v = target()
    first = ca.ssp_release(release_msg(v), ctx(nc, run_id=1))
    again = ca.ssp_release(release_msg(v), ctx(nc, run_id=1))      # a fresh Context: only the store remembers
    a, b = (r.content.array_records["release"] for r in (first, again))
    assert np.array_equal(a["s_test"].numpy(), b["s_test"].numpy()) and np.array_equal(a["xg"].numpy(), b["xg"].numpy())
    assert len(ledger_entries(nc, rc())) == 1
    # another target in the same run: refused (a second answer would reveal the noise)
    ref = refusal(ca.ssp_release(release_msg(v * 0.5), ctx(nc, run_id=1)))
    assert ref["code"] == "replay"
    # a new run asking for the same release (a re-run after a crash): the stored draw, charged once
    c = ca.ssp_release(release_msg(v), ctx(nc, run_id=2)).content.array_records["release"]
    assert np.array_equal(c["s_test"].numpy(), a["s_test"].numpy()) and np.array_equal(c["xg"].numpy(), a["xg"].numpy())
    # another target in a new run: the same ledger, whose budget is spent
    ref = refusal(ca.ssp_release(release_msg(v * 0.5), ctx(nc, run_id=4)))
    assert ref["code"] == "budget" and "above the budget ε=20" in ref["reason"], ref["reason"]
    assert len(ledger_entries(nc, rc())) == 1
    # the same through the strategy, another target (another clip in party 0's node config): refused
    # before any charge; party 1 (a fresh ledger) makes its release, stored for a re-run
    ncs = nodes(tmp_path)
    ncs[100]["dp-clip"] = 1.0
    with pytest.raises(PartyRefused, match=r"^party 0 refused: party 0 refuses the eval release for round 1 .*above "
                                           r"the budget ε=20\b"):
        run_flower(rc(), ncs, run_id=3)
    assert [len(ledger_entries(n, rc())) for n in ncs.values()] == [1, 1]      # party 0: nothing more


def test_run_config_keys_naming_files_or_privacy_are_refused_or_ignored(tmp_path):
    nc = nodes(tmp_path)[100]
    v = target()
    with pytest.raises(ConfigError, match="run config key 'party-data-paths'"):
        ca.ssp_release(release_msg(v), ctx(nc, run_config=rc(**{"party-data-paths": "/tmp/x.csv"})))
    with pytest.raises(ConfigError, match="node config key 'dp-seed'"):
        ca.ssp_release(release_msg(v), ctx({**nc, "dp-seed": 3}))
    # the ServerApp refuses a party's privacy key in the run config, and ADMM-only keys on this route
    with pytest.raises(ConfigError, match="'dp-epsilon'=100.0 is refused"):
        make_strategy(rc(**{"dp-epsilon": 100.0}))
    with pytest.raises(ConfigError, match="run config key 'rho'=1.0 is refused with route='stacked-ssp'"):
        make_strategy(rc(rho=1.0))
    with pytest.raises(ConfigError, match="route"):
        make_strategy(rc(route="stacked"))
    # a party never reads privacy from the run config: a run config asking for a larger budget, another
    # clip, no dp or another state-dir changes nothing the party spends or where it keeps its ledger
    loose = rc(**{"dp-epsilon": 100.0, "dp-clip": 1000.0, "dp": False, "state-dir": str(tmp_path / "elsewhere")})
    rep = ca.ssp_release(release_msg(v), ctx(nc, run_config=loose))
    import json
    report = json.loads(rep.content.config_records["privacy"]["report"])
    assert report["config"]["epsilon"] == EPS and report["config"]["c_v"] == C_V
    assert len(ledger_entries(nc, rc())) == 1 and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("bad", ["nan", "inf", "short", "long", "int", "missing", "round"])
def test_a_bad_target_is_refused_before_any_charge(tmp_path, bad):
    nc = nodes(tmp_path)[100]
    v = target()
    msg = {"nan": lambda: release_msg(np.where(np.arange(v.size) == 3, np.nan, v)),
           "inf": lambda: release_msg(np.where(np.arange(v.size) == 3, np.inf, v)),
           "short": lambda: release_msg(v[:-1]), "long": lambda: release_msg(np.r_[v, 0.0]),
           "int": lambda: release_msg(np.sign(v).astype(np.int64)),
           "missing": lambda: Message(RecordDict({"config": ConfigRecord({"round": 1})}), dst_node_id=7,
                                      message_type="query.ssp_release"),
           "round": lambda: release_msg(v, rnd=0)}[bad]()
    ref = refusal(ca.ssp_release(msg, ctx(nc)))
    assert ref["code"] == "invalid" and ref["field"] in ("vectors.v", "config.round"), dict(ref)
    assert ledger_entries(nc, rc()) == []
    # the same party then releases normally: nothing was spent
    assert "release" in ca.ssp_release(release_msg(v), ctx(nc)).content.array_records


def test_admm_and_ssp_releases_of_a_party_compose_in_one_ledger(tmp_path):
    # ADMM first (route='admm', the same node configs): the private parties release once (eval), charged
    ncs = nodes(tmp_path, eps=EPS)
    admm_rc = {"dataset": "breast_cancer", "num-parties": M, "max-rounds": 3, "party-wait": 0.0}
    st = make_strategy(admm_rc)
    st.start(grid=LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}, ncs,
                            admm_rc, run_id=11), initial_arrays=ArrayRecord(), num_rounds=3, timeout=120)
    spent = {nc["partition-id"]: ledger_entries(nc, admm_rc) for nc in ncs.values()}
    assert all(len(e) == 1 and e[0].unit != "ssp:row" for e in spent.values())
    # the SSP route sees that spend in the same ledger: refused at identify, and a direct release too
    with pytest.raises(PartyRefused, match="remaining budget cannot cover its one SSP release"):
        run_flower(rc(), ncs, run_id=12)
    nc = ncs[100]
    ident = ca.ssp_identify(Message(RecordDict({}), dst_node_id=7, message_type="query.ssp_identify"),
                            ctx(nc, run_id=12)).content.config_records["identity"]
    assert ident["affordable"] is False and ident["spent_before_run"] == pytest.approx(
        st.privacy_[0]["totals"]["exact"], rel=1e-9)
    ref = refusal(ca.ssp_release(release_msg(target()), ctx(nc, run_id=12)))
    assert ref["code"] == "budget" and "above the budget ε=20" in ref["reason"]
    # the other order, on fresh parties: one SSP release each (ε = the whole budget) and
    # the ADMM run's identify then reports it cannot afford its plan
    ncs2 = nodes(tmp_path / "second")
    for nc2 in ncs2.values():
        assert "release" in ca.ssp_release(release_msg(target()), ctx(nc2, run_id=13)).content.array_records
    from flower_vfl.strategies.exchange import ReplyError
    st2 = make_strategy(admm_rc)
    with pytest.raises(ReplyError, match="remaining budget cannot cover its plan"):
        st2.start(grid=LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}, ncs2,
                                 admm_rc, run_id=14), initial_arrays=ArrayRecord(), num_rounds=3, timeout=120)
    assert all(len(ledger_entries(n, rc())) == 1 for n in ncs2.values())


def test_a_non_private_party_refuses(tmp_path):
    nc = nodes(tmp_path, private=False)[100]
    ref = refusal(ca.ssp_release(release_msg(target()), ctx(nc)))
    assert "is not private" in ref["reason"] and "route='admm'" in ref["reason"]
    with pytest.raises(PartyRefused, match="is not private"):
        run_flower(rc(), nodes(tmp_path, private=False))


# ------------------------------------------------------------------ (c) the goal on a9a through Flower
def test_a9a_both_private_at_epsilon_1_through_flower(tmp_path):
    st = run_flower(rc("a9a"), nodes(tmp_path, eps=EPS_A9A))
    row = st.history_[-1]
    print(f"a9a, both private at epsilon=1, stacked SSP through Flower: accuracy {row['test_accuracy']:.4f}, "
          f"log-loss {row['test_loss']:.4f}")
    assert row["test_accuracy"] >= 0.840 and row["test_loss"] <= 0.345, row
    assert all(rep["totals"]["exact"] <= EPS_A9A * (1 + 1e-9) for rep in st.privacy_.values())
