"""Plain rounds on the Flower path (issue 24 item 2): the central node tells a party, in its train
config, that no accelerator runs (``config['plain_rounds']``), and a non-private party's ClientApp
then takes the engine's plain-round x-update (``PartyUpdate.plain_rounds``: the looser forcing,
and for a tall sparse L2 block CG with its predicted last iteration instead of the Gram).

Through the real ClientApp handlers on a small a9a-format block (party 1 of 2), with the 'auto'
thresholds lowered so that the plain x-update is CG (``xsolve.CG_ROWS``,
``GRAM_PAIRS_PER_NNZ_L2``):

- a non-private party's replies with the hint are the engine's plain-round x-updates (the same
  ``PartyUpdate``: bitwise), also when every message is a fresh process (the solver cache emptied: CG's
  measured rate travels in the party's state), and without the hint the accelerated ones;
- the same run twice in one process (the cached solver reused) gives bitwise the same releases:
  a solver taken from the cache carries no other run's CG state;
- a hint that is not a bool is refused, naming the key, and nothing changes;
- a private party's release does not depend on the hint (same noise stream: identical);
- the strategy sends the hint exactly when its round driver runs no accelerator, and the Flower
  path then gives bitwise the engine's decision values, history and Jacobi damping theta per round
  (which a run with a checkpoint keeps at 1/M).
"""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.clients import party_public
from flower_vfl.core import xsolve
from flower_vfl.core.party import PLAIN_ROUNDS, PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io import data as data_mod
from flower_vfl.io import party_cache as pc

LAM = 1e-2
ROUNDS = 8


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def _forget():
    data_mod.party_block.cache_clear()
    data_mod.load_all.cache_clear()
    pc._MEMO.clear()


def _write_libsvm(path, n, seed):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        cols = np.sort(rng.choice(np.arange(1, 124), size=rng.integers(3, 15), replace=False))
        lines.append(("+1" if rng.random() < 0.4 else "-1") + " " + " ".join(f"{c}:1" for c in cols))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def a9a_dir(tmp_path, monkeypatch):
    """A small a9a stand-in (400 rows, the LIBSVM layout) whose plain x-update is CG."""
    monkeypatch.setenv("FLOWER_VFL_CACHE", str(tmp_path / "bundled"))
    monkeypatch.setenv("FLOWER_VFL_BLOCK_CACHE", "0")
    monkeypatch.setattr(xsolve, "CG_ROWS", 100)
    monkeypatch.setattr(xsolve, "GRAM_PAIRS_PER_NNZ_L2", 0)
    d = tmp_path / "a9a"
    d.mkdir()
    _write_libsvm(d / "a9a", 400, 0)
    _write_libsvm(d / "a9a.t", 50, 1)
    _forget()
    party_public._SOLVERS.clear()
    yield d
    _forget()
    party_public._SOLVERS.clear()


def _rc(d, **kw):
    return {"dataset": "a9a", "num-parties": 2, "lam": LAM, "data-dir": str(d), **kw}


def _context(tmp_path, d, run_id=1, node_config=None):
    nc = node_config or {"partition-id": 1, "state-dir": str(tmp_path / "party1"), "data-dir": str(d)}
    return Context(run_id=run_id, node_id=7, node_config=dict(nc), state=RecordDict(), run_config=_rc(d))


def _inputs(n, k):
    """Round k's (q, y): residuals shrinking as in a converging run."""
    rng = np.random.default_rng(100 + k)
    return rng.normal(size=n) * 0.3 * 0.6 ** k, rng.normal(size=n) * 1e-2


def _message(rnd, q, y, **cfg):
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": 0.5, "alpha": 1.0, "theta": 0.5, **cfg}),
                     "vectors": ArrayRecord({"q": Array(q), "y": Array(y)})})
    return Message(rd, dst_node_id=7, message_type="train")


def _flower(context, n, fresh_process=False, **cfg):
    out = []
    for k in range(1, ROUNDS + 1):
        if fresh_process:
            party_public._SOLVERS.clear()          # a real SuperNode: every message a new process
        rep = ca.train(_message(k, *_inputs(n, k), **cfg), context)
        assert "release" in rep.content, dict(rep.content.get("refusal", {}))
        out.append(rep.content["release"]["s"].numpy())
    return out


def _engine(D, plain):
    """The engine's party (estimator/engine.py builds it so) over the same messages."""
    p = PartyUpdate(D, get_penalty("l2", 0.5), LAM, None, x_solver="auto", center=True)
    if plain:
        p.plain_rounds()
    out, skipped = [], 0
    for k in range(1, ROUNDS + 1):
        out.append(np.array(p.train_release(k, *_inputs(D.shape[0], k), rho=0.5, alpha=1.0, theta=0.5)))
        skipped += p.carry is not None and p.carry[1] is None
    return out, p, skipped


def test_a_non_private_party_told_plain_rounds_takes_the_engines_x_update(tmp_path, a9a_dir):
    D = data_mod.party_block("a9a", 1, 2, str(a9a_dir))[0]
    ref, p, skipped = _engine(D, plain=True)
    assert p.solver.method_ == "cg" and p.solver.predict_last and skipped > 0
    got = _flower(_context(tmp_path / "a", a9a_dir), D.shape[0], plain_rounds=True)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    # a fresh process per message: the measured CG rate comes back from the party's state
    fresh = _flower(_context(tmp_path / "b", a9a_dir), D.shape[0], fresh_process=True, plain_rounds=True)
    assert all(np.array_equal(a, b) for a, b in zip(fresh, got))
    # without the hint (an accelerated run): the engine's accelerated x-update, the Gram
    acc, pa, _ = _engine(D, plain=False)
    assert pa.solver.method_ == "gram"
    got_acc = _flower(_context(tmp_path / "c", a9a_dir), D.shape[0])
    for a, b in zip(got_acc, acc):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(got[-1], got_acc[-1], rtol=1e-9, atol=0)     # the hint changed the x-update


def test_the_same_run_twice_in_one_process_gives_bitwise_the_same_releases(tmp_path, a9a_dir):
    n = data_mod.party_block("a9a", 1, 2, str(a9a_dir))[0].shape[0]
    first = _flower(_context(tmp_path / "a", a9a_dir, run_id=1), n, plain_rounds=True)
    assert len(party_public._SOLVERS) == 1
    solver = next(iter(party_public._SOLVERS.values()))
    assert solver._cg_rate is not None                 # the first run left a measured rate behind
    second = _flower(_context(tmp_path / "b", a9a_dir, run_id=2), n, plain_rounds=True)
    assert next(iter(party_public._SOLVERS.values())) is solver         # the cached solver, reused
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("value", ["true", 1, 0.0])
def test_a_hint_that_is_not_a_bool_is_refused_naming_the_key(tmp_path, a9a_dir, value):
    context = _context(tmp_path, a9a_dir)
    n = data_mod.party_block("a9a", 1, 2, str(a9a_dir))[0].shape[0]
    rep = ca.train(_message(1, *_inputs(n, 1), plain_rounds=value), context)
    ref = rep.content["refusal"]
    assert ref["reason"] == f"party 1: config['plain_rounds']={value!r} is not a boolean; send true or false"
    assert ref["field"] == "config.plain_rounds" and ref["code"] == "invalid"
    assert len(context.state) == 0                     # nothing kept, nothing answered


def test_a_private_party_ignores_the_hint(tmp_path, monkeypatch):
    """Same noise stream (as tests/test_flower.py's comparison of the two paths): the releases
    with the hint, without it, and with a malformed one are identical (the key is not read)."""
    from _party_handlers import N, RC
    from flower_vfl.privacy import mechanism

    def rng(self, round, kind="train"):
        seq = np.random.SeedSequence(entropy=11, spawn_key=(self._party_key, int(round), mechanism.KIND_CODES[kind]))
        return np.random.default_rng(seq)
    monkeypatch.setattr(mechanism.GaussianOutputMechanism, "rng", rng)

    def run(tag, **cfg):
        nc = {"partition-id": 1, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 3, "dp-eval-rounds": 1,
              "state-dir": str(tmp_path / tag)}
        context = Context(run_id=1, node_id=7, node_config=nc, state=RecordDict(), run_config=dict(RC))
        out = []
        for k in (1, 2, 3):
            r = np.random.default_rng(k)
            rd = RecordDict({"config": ConfigRecord({"round": k, "rho": 1e-3, "alpha": 1.0, "theta": 0.5, **cfg}),
                             "vectors": ArrayRecord({"q": Array(r.normal(size=N) * 0.1),
                                                     "y": Array(r.normal(size=N) * 1e-4)})})
            rep = ca.train(Message(rd, dst_node_id=7, message_type="train"), context)
            assert "release" in rep.content, dict(rep.content.get("refusal", {}))
            out.append(rep.content["release"]["s"].numpy())
        return out

    base = run("none")
    for tag, cfg in (("true", {PLAIN_ROUNDS: True}), ("false", {PLAIN_ROUNDS: False}), ("bad", {PLAIN_ROUNDS: "yes"})):
        assert all(np.array_equal(a, b) for a, b in zip(run(tag, **cfg), base)), tag


@pytest.mark.parametrize("acceleration", ["none", "anderson"])
def test_the_strategy_sends_the_hint_and_the_flower_path_is_the_engine(tmp_path, a9a_dir, acceleration):
    sent, thetas = [], []
    handlers = {"train": lambda m, c: sent.append(m.content["config"][PLAIN_ROUNDS])
                or thetas.append((m.content["config"]["round"], m.content["config"]["theta"])) or ca.train(m, c),
                "evaluate": ca.evaluate, "query.identify": ca.identify}
    rc = _rc(a9a_dir, **{"max-rounds": 12, "acceleration": acceleration})
    nodes = {100 + i: {"partition-id": i, "data-dir": str(a9a_dir)} for i in range(2)}
    st = sa.make_strategy(rc)
    st.start(LocalGrid(handlers, nodes, rc))
    assert sent and set(sent) == {acceleration == "none"}
    blocks = [data_mod.party_block("a9a", i, 2, str(a9a_dir)) for i in range(2)]
    y, _ = data_mod.labels("a9a", str(a9a_dir))
    after = []                 # the engine's theta for the next round, after each round
    m = VerticalADMM(lam=LAM, max_rounds=12, tol=0, acceleration=acceleration,
                     callback=lambda k, e: after.append(e._central.theta)).fit([b[0] for b in blocks], y)
    assert all(p.solver.method_ == ("cg" if acceleration == "none" else "gram") for p in m._parties)
    # the Jacobi damping the parties were sent is the engine's round for round: it follows the
    # releases in plain rounds (variant 'sharing', core/rounds.py) and stays 1/M with Anderson
    by_round = sorted(set(thetas))
    assert [k for k, _ in by_round] == list(range(1, 13))
    assert [t for _, t in by_round] == [0.5] + after[:-1]
    assert (len(set(after)) > 1) == (acceleration == "none") and min(after) >= 0.5
    np.testing.assert_array_equal(st.decision_test_, m.decision_function([b[1] for b in blocks]))
    keys = ("round", "train_loss", "objective", "primal_residual", "dual_residual", "rho")
    assert [[h[k] for k in keys] for h in st.history_] == [[h[k] for k in keys] for h in m.history_]


def test_a_run_that_checkpoints_gets_no_hint_and_resumes_as_before(tmp_path, a9a_dir):
    """A resume is a new run: its parties come back without state and are sent their last round
    again (strategies/vertical_rounds.py, ``resync``), whose release must be the checkpoint's. An
    inexact, warm-started CG x-update from x = 0 cannot give it (the resume would be refused, as for
    x-solver='cg'), so a run with a checkpoint (state-dir) or a resume never sends the hint: its
    parties take the accelerated rounds' x-update (here the Gram), and the crashed run resumes to
    the uninterrupted run's model. (Within one run the CG state travels in context.state.)"""
    from tests.test_strategy_faults import FaultyGrid, round_of

    class Crash(Exception):
        pass

    rc = _rc(a9a_dir, **{"max-rounds": 10, "party-wait": 0.0, "acceleration": "none"})
    nodes = {100 + i: {"partition-id": i, "data-dir": str(a9a_dir)} for i in range(2)}
    sent, thetas = [], []

    def fault(msg, grid):
        if msg.metadata.message_type == "train":
            sent.append(msg.content["config"][PLAIN_ROUNDS])
            thetas.append(msg.content["config"]["theta"])
        if round_of(msg) == 6 and not sent_resumed:
            raise Crash
    sent_resumed = False
    state = tmp_path / "state"
    with pytest.raises(Crash):
        sa.make_strategy({**rc, "state-dir": str(state)}).start(FaultyGrid(nodes, rc, fault))
    sent_resumed = True
    st = sa.make_strategy({**rc, "resume": str(state)})
    st.start(FaultyGrid(nodes, rc, fault))
    assert sent and not any(sent)
    assert set(thetas) == {0.5}            # nor does theta follow the releases (a replay would need it)
    ref = sa.make_strategy({**rc, "state-dir": str(tmp_path / "ref")})
    ref.start(FaultyGrid(nodes, rc))
    assert len(st.history_) == len(ref.history_) == 10
    np.testing.assert_allclose(st.decision_test_, ref.decision_test_, rtol=1e-9, atol=1e-12)
