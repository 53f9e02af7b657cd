"""Issue 23 (1-2) on the central node, and issue 20.5 through the ServerApp: every number the
central node receives is range-checked; a resume never returns a wrong model (another run's
settings or another party's data are refused, parties without state are restored before
anything else, bitwise); a run stopped by a refusal fails; labels are spent once.

All in process: the real ServerApp / strategy and the real ClientApp handlers over a
LocalGrid (tests/test_strategy_faults.py's FaultyGrid), a fresh Context per node and run."""

import json
import re

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.io.checkpoint import load_checkpoint
from flower_vfl.privacy.label_dp import LabelBudgetError, LabelStore
from flower_vfl.strategies.checkpointing import ResumeRefused
from flower_vfl.strategies.exchange import ReplyError
from flower_vfl.strategies.vertical_admm import PartyRefused
from _wire import edit_reply
from tests.test_strategy_faults import RC, FaultyGrid, nodes, round_of


class Crash(Exception):
    pass


def strategy(rc=None, **kw):
    return sa.make_strategy({**RC, **(rc or {}), **kw})


def counting(grid):
    """The grid's messages, in order (message type, destination)."""
    sent = []
    real = grid.send_and_receive

    def send_and_receive(messages, *, timeout=None):
        messages = list(messages)
        sent.extend((m.metadata.message_type, m.metadata.dst_node_id) for m in messages)
        return real(messages, timeout=timeout)
    grid.send_and_receive = send_and_receive
    return sent


@pytest.fixture(scope="module")
def clean():
    st = strategy()
    st.start(FaultyGrid(nodes(), RC))
    return st


def same_model(a, b):
    assert np.array_equal(a.decision_test_, b.decision_test_)
    assert np.array_equal(a.central.z, b.central.z) and np.array_equal(a.central.y, b.central.y)
    assert np.array_equal(np.asarray(a.central.b), np.asarray(b.central.b))
    assert a.final_["test_accuracy"] == b.final_["test_accuracy"]
    assert [r["primal_residual"] for r in a.history_] == [r["primal_residual"] for r in b.history_]


# ------------------------------------------------------------------ numbers the central node receives
def _train_reply(party, mutate, rounds=(3,)):
    def fault(msg, grid):
        if round_of(msg) in rounds and msg.metadata.dst_node_id == 100 + party:
            return lambda rep: (mutate(rep), [rep])[1]
        return None
    return fault


def _set_s(value, key="s"):
    def mutate(rep):
        from flwr.app import Array, ArrayRecord

        def edit(content):
            v = content["release"][key].numpy().copy()
            v[7] = value
            content["release"] = ArrayRecord({key: Array(v)})
        edit_reply(rep, edit)
    return mutate


def test_a_release_beyond_max_release_is_refused_naming_party_and_value():
    st = strategy()
    with pytest.raises(ReplyError) as err:
        st.start(FaultyGrid(nodes(), RC, _train_reply(1, _set_s(1e300))))
    assert str(err.value) == ("party 1 (node 101), round 3 (train): release['s'] holds 1 value(s) beyond +-1e+06 "
                              "(e.g. 1e+300 at row 7); refused: the central node's max-release=1e+06 (run config) "
                              "bounds every released value; raise it only if the parties' values can be that large")
    assert len(st.history_) == 2 and st.failed_
    # the label owner's config sets the bound: a smaller one refuses an ordinary release
    with pytest.raises(ReplyError, match=r"party 0 \(node 100\), round 1 \(train\): release\['s'\] holds \d+ value"
                                         r"\(s\) beyond \+-0\.001 .*max-release=0\.001"):
        strategy(**{"max-release": 1e-3}).start(FaultyGrid(nodes(), RC))


def test_test_scores_beyond_max_release_are_refused():
    def fault(msg, grid):
        if msg.metadata.message_type == "evaluate" and msg.metadata.dst_node_id == 100:
            return lambda rep: (_set_s(-3e9, "s_test")(rep), [rep])[1]
        return None
    with pytest.raises(ReplyError, match=re.escape("party 0 (node 100), round 8 (final evaluate): release['s_test'] "
                                                   "holds 1 value(s) beyond +-1e+06 (e.g. -3000000000.0 at row 7)")):
        strategy().start(FaultyGrid(nodes(), RC, fault))


@pytest.mark.parametrize("value, says", [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_a_penalty_out_of_range_is_refused(value, says):
    def mutate(rep):
        rep.content["meta"]["penalty"] = value
    with pytest.raises(ReplyError, match=re.escape(f"party 0 (node 100), round 3 (train): meta['penalty']={says}; a "
                                                   "penalty lam R(x_m) is a finite number >= 0; refused")):
        strategy().start(FaultyGrid(nodes(), RC, _train_reply(0, mutate)))


@pytest.mark.parametrize("rounds", [10**9, -3])
def test_a_private_plan_out_of_range_is_refused_at_identify(rounds):
    """A party that declares train_rounds=10**9 (an endless run) or -3: refused before any round."""
    def fault(msg, grid):
        if msg.metadata.message_type == "query.identify" and msg.metadata.dst_node_id == 101:
            def mutate(rep):
                rep.content["identity"]["private"] = True
                rep.content["identity"]["train_rounds"] = rounds
                return [rep]
            return mutate
        return None
    grid = FaultyGrid(nodes(), RC, fault)
    sent = counting(grid)
    with pytest.raises(ReplyError) as err:
        strategy().start(grid)
    assert str(err.value) == f"node 101: identity['train_rounds']={rounds} is outside 0..10000; refused"
    assert {t for t, _ in sent} == {"query.identify"}


# ------------------------------------------------------------------ resume: the same run, or refused
@pytest.fixture
def checkpoint(tmp_path):
    """A finished 8-round run's state folder."""
    state = tmp_path / "state"
    strategy(**{"state-dir": str(state)}).start(FaultyGrid(nodes(), RC))
    return state


@pytest.mark.parametrize("change, says", [
    ({"lam": 1e-2}, "lam=0.0001 in the checkpoint, 0.01 in this run"),
    ({"rho": 0.5}, "rho=0.0 in the checkpoint, 0.5 in this run"),
    ({"penalty": "l1"}, "penalty='l2' in the checkpoint, 'l1' in this run"),
    ({"acceleration": "none"}, "acceleration='auto' in the checkpoint, 'none' in this run"),
    ({"max-rounds": 12}, "max-rounds=8 in the checkpoint, 12 in this run"),
    ({"alpha": 1.5, "x-solver": "cg"}, "alpha=1.0 in the checkpoint, 1.5 in this run; x-solver='auto' in the "
                                       "checkpoint, 'cg' in this run"),
])
def test_a_resume_with_other_settings_is_refused_before_any_message(checkpoint, change, says):
    grid = FaultyGrid(nodes(), RC)
    sent = counting(grid)
    with pytest.raises(ResumeRefused) as err:
        strategy(resume=str(checkpoint), **change).start(grid)
    assert str(err.value) == (f"resume={str(checkpoint)!r}: the checkpoint was made by another run: {says}. Resume "
                              "with the checkpoint's settings, or start a new run without resume")
    assert sent == []


def test_resume_after_the_last_round_gives_the_uninterrupted_model_bitwise(checkpoint, clean):
    """The issue's case: the parties come back without state (a new run); before, the final
    evaluation used x_m = 0 (accuracy 0.629 instead of 0.937). Now each party is sent its last
    round again first: its release equals the checkpoint's, the model is the same bitwise."""
    grid = FaultyGrid(nodes(), RC)
    sent = counting(grid)
    st = strategy(resume=str(checkpoint))
    st.start(grid)
    same_model(st, clean)
    assert st.final_["test_accuracy"] == pytest.approx(0.951049, abs=1e-6)     # df05b59: 0.6294 (x_m = 0)
    assert [t for t, _ in sent] == ["query.identify"] * 2 + ["train"] * 2 + ["evaluate"] * 2
    assert st.replay_[0][0] == 8 and not st.state_.resync


def test_crash_in_the_final_evaluation_then_resume(tmp_path, clean):
    state = tmp_path / "state"

    def fault(msg, grid):
        if msg.metadata.message_type == "evaluate":
            raise Crash
        return None
    with pytest.raises(Crash):
        strategy(**{"state-dir": str(state)}).start(FaultyGrid(nodes(), RC, fault))
    assert load_checkpoint(state)[1]["round"] == 8
    st = strategy(resume=str(state))
    st.start(FaultyGrid(nodes(), RC))
    same_model(st, clean)


def test_crash_mid_run_then_resume_with_stateless_parties_is_bitwise(tmp_path, clean):
    """The ServerApp dies in round 5; a new run (parties without state) resumes from round 4:
    the parties are restored by round 4 again, the run continues bitwise (before: within 1e-9)."""
    state = tmp_path / "state"
    with pytest.raises(Crash):
        strategy(**{"state-dir": str(state)}).start(
            FaultyGrid(nodes(), RC, lambda msg, grid: (_ for _ in ()).throw(Crash) if round_of(msg) == 5 else None))
    st = strategy(resume=str(state))
    st.start(FaultyGrid(nodes(), RC))
    same_model(st, clean)


def test_a_party_back_on_other_data_is_refused(checkpoint, monkeypatch):
    """Party 1 comes back on row-permuted data (same row count): its replayed release differs
    from the checkpoint's, the resume is refused naming the party, before any round."""
    real = ca.cached_party_block

    def permuted(dataset, party, *a, **kw):
        D, D_test = real(dataset, party, *a, **kw)
        if party == 1:
            D = D[np.random.default_rng(0).permutation(D.shape[0])]
        return D, D_test
    monkeypatch.setattr(ca, "cached_party_block", permuted)
    grid = FaultyGrid(nodes(), RC)
    sent = counting(grid)
    st = strategy(resume=str(checkpoint))
    with pytest.raises(ResumeRefused, match=r"^party 1 \(node 101\) was sent round 8 again to restore its state and "
                                            r"released another s_m than in that round \(max \|difference\| [0-9.e+-]+ "
                                            r"over 426 rows\): its data or its settings changed \(rows, row order, "
                                            r"columns, lam, penalty, x-solver\)\. Give the party its original data"):
        st.start(grid)
    assert "evaluate" not in {t for t, _ in sent} and st.failed_
    assert load_checkpoint(checkpoint)[1]["round"] == 8          # the checkpoint is untouched


def test_a_party_back_with_other_held_out_rows_is_refused(checkpoint):
    def fault(msg, grid):
        if msg.metadata.message_type == "query.identify" and msg.metadata.dst_node_id == 100:
            return lambda rep: (rep.content["identity"].__setitem__("n_test", 99), [rep])[1]
        return None
    with pytest.raises(ValueError, match=r"party 0 \(node 100\) holds 99 held-out rows but the held-out labels have "
                                         r"143; the parties' test samples are not aligned"):
        strategy(resume=str(checkpoint)).start(FaultyGrid(nodes(), RC, fault))


def test_a_checkpoint_without_a_run_record_is_refused(checkpoint):
    from flower_vfl.io.checkpoint import save_checkpoint
    arrays, header = load_checkpoint(checkpoint)
    del header["run"]
    save_checkpoint(checkpoint, arrays, header)
    with pytest.raises(ResumeRefused, match=r"the checkpoint records no run settings \(it was written by an earlier "
                                            r"version\)"):
        strategy(resume=str(checkpoint)).start(FaultyGrid(nodes(), RC))


# ------------------------------------------------------------------ the ServerApp: refusal = failure
def _main(grid, rc):
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    return sa.main(grid, ctx)


def test_a_run_stopped_by_a_refusal_fails(tmp_path):
    """A private party with dp-eval-rounds 0 refuses the final evaluation: the ServerApp raises
    (Flower marks the run failed) and the report says failed, with the reason."""
    out = tmp_path / "out"
    rc = {**RC, "out-dir": str(out), "max-rounds": 3}
    cfg = nodes()
    cfg[101].update({"dp": True, "dp-epsilon": 4.0, "dp-train-rounds": 1, "dp-eval-rounds": 0})
    with pytest.raises(PartyRefused, match=r"^party 1 refused: "):
        _main(FaultyGrid(cfg, rc), rc)
    final = json.loads((out / "report.json").read_text())["final"]
    assert final["failed"] is True and final["error"].startswith("PartyRefused: party 1 refused: ")
    assert final["rounds"] == 4


# ------------------------------------------------------------------ labels spent once (issue 20.5)
def _capture(monkeypatch):
    made, real = [], sa.make_strategy
    monkeypatch.setattr(sa, "make_strategy", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    return made


def test_label_dp_runs_reuse_one_draw_and_a_second_epsilon_is_refused(tmp_path, monkeypatch):
    """Two ServerApp runs at label-epsilon=1 on breast_cancer (different out-dirs) train on the
    same flipped labels, kept in the label owner's default state folder; label-epsilon=2 on the
    same source is refused with the store's message before any message is sent."""
    from flower_vfl.io.data import labels
    from flower_vfl.privacy.store import default_state_dir
    made = _capture(monkeypatch)
    y = np.where(labels("breast_cancer")[0] == 1, 1.0, -1.0)
    for run in (1, 2):
        rc = {**RC, "label-epsilon": 1.0, "max-rounds": 2, "out-dir": str(tmp_path / f"out{run}")}
        _main(FaultyGrid(nodes(), rc), rc)
    first, second = made
    assert np.array_equal(first.t, second.t) and not np.array_equal(first.t, y)
    assert [s.label_privacy_.entries[0]["reused"] for s in made] == [0, 426]
    assert (default_state_dir() / LabelStore.FILE).is_file()
    rc = {**RC, "label-epsilon": 2.0, "max-rounds": 2}
    grid = FaultyGrid(nodes(), rc)
    sent = counting(grid)
    with pytest.raises(LabelBudgetError, match=r"^label source bundled:breast_cancer: its labels were drawn once at "
                                               r"label-epsilon=1 \(426 labels, .*\) and are reused in every run; "
                                               r"label-epsilon=2 would be a second release of the same labels"):
        _main(grid, rc)
    assert sent == []


def test_the_label_store_lives_in_the_run_configs_state_dir(tmp_path, monkeypatch):
    from flower_vfl.privacy.store import default_state_dir
    made = _capture(monkeypatch)
    state = tmp_path / "owner-state"
    rc = {**RC, "label-epsilon": 1.0, "max-rounds": 2, "state-dir": str(state)}
    _main(FaultyGrid(nodes(), rc), rc)
    assert (state / LabelStore.FILE).is_file() and not (default_state_dir() / LabelStore.FILE).exists()
    # the resumed run reuses the same draw (and the checkpoint's copy of it)
    _main(FaultyGrid(nodes(), rc), {**rc, "resume": str(state)})
    assert np.array_equal(made[0].t, made[1].t)
