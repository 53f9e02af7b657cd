"""One downlink N-vector at alpha = 1: the central node sends a party its x-update target v alone.

At alpha = 1 a party's x-update reads only ``v = s_m - theta q - y / rho_x``; the central node,
which holds each party's last release s_m, forms it with the party's own function
(``flower_vfl.core.party.x_update_target``) and sends it instead of q and y (8 N bytes a round, not
16 N). Checked here through the real ClientApp handlers with a fresh ``Context`` per party: the
release from v is bitwise the release from (q, y), for the direct and the CG x-update; a private
party clips whatever v it gets (a v beyond its clip gives the release of the clipped v); a party
refuses v at alpha != 1, a negative ``q_norm``, and v where it needs q (a private party's final
update); and on the in-process grid (real strategy, exchange and handlers) every train request
after round 1 carries one N-vector and the run ends bitwise where the engine ends
(tests/test_plain_rounds_flower.py checks every round of the default runs).
"""

import copy

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.core.party import target_norm, x_update_target
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import party_block
from flower_vfl.privacy import mechanism
from _wire import travelled

N = party_block("breast_cancer", 1, 2)[0].shape[0]
RHO, THETA = 1e-3, 0.5


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def ctx(node_config, run_config=None):
    return Context(run_id=1, node_id=7, node_config=dict(node_config), state=RecordDict(),
                   run_config={"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2, **(run_config or {})})


def content(rnd, alpha=1.0, **vectors_and_cfg):
    vecs = {k: v for k, v in vectors_and_cfg.items() if isinstance(v, np.ndarray)}
    cfg = {k: v for k, v in vectors_and_cfg.items() if not isinstance(v, np.ndarray)}
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": RHO, "alpha": alpha, "theta": THETA, **cfg})})
    if vecs:
        rd["vectors"] = ArrayRecord({k: Array(v) for k, v in vecs.items()})
    return rd


def send(context, rd, kind="train"):
    handler = ca.train if kind == "train" else ca.evaluate
    return handler(Message(rd, dst_node_id=7, message_type=kind), context)


def s_of(reply):
    assert "release" in reply.content, dict(reply.content.get("refusal", {}))
    return reply.content["release"]["s"].numpy()


def reason(reply):
    assert "refusal" in reply.content, f"expected a refusal, got {list(reply.content.keys())}"
    return reply.content["refusal"]["reason"]


def rounds(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=N) * 0.1, rng.normal(size=N) * 1e-4) for _ in range(3)]


@pytest.mark.parametrize("solver", ["auto", "cg"])
def test_the_target_alone_gives_bitwise_the_release_of_q_and_y(solver):
    """Rounds 2 and 3 sent as (q, y) to one party and as v (formed from the release the central
    node got) to another with the same round 1: bitwise the same releases."""
    (q1, y1), (q2, y2), (q3, y3) = rounds()
    a, b = (ctx({"partition-id": 0}, {"x-solver": solver}) for _ in range(2))
    s1 = s_of(send(a, content(1, q=q1, y=y1)))
    assert np.array_equal(s_of(send(b, content(1, q=q1, y=y1))), s1)
    s_prev = s1
    for k, (q, y) in ((2, (q2, y2)), (3, (q3, y3))):
        want = s_of(send(a, content(k, q=q, y=y)))
        v = x_update_target(s_prev, q, y, RHO, THETA)[1]
        got = s_of(send(b, content(k, v=v, q_norm=target_norm(q))))
        assert np.array_equal(got, want), f"round {k}"
        s_prev = got


def test_a_private_party_clips_the_target_it_is_sent(tmp_path, monkeypatch):
    """With the noise stream fixed (the trajectory check's): a v far beyond the party's clip
    (dp-clip, 10) gives bitwise the release of v clipped to +-10; the sensitivity the ledger
    charges is the same either way (it is the clip's, not the message's)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "trajectory_check", Path(__file__).resolve().parents[1] / "benchmarks" / "trajectory_check.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    monkeypatch.setattr(mechanism.GaussianOutputMechanism, "rng", tc.noise_rng)
    (q1, y1), _, _ = rounds(1)
    sign = np.where(np.arange(N) % 2 == 0, 1.0, -1.0)
    out = []
    for name, v in (("huge", 1e6 * sign), ("clip", 10.0 * sign)):
        c = ctx({"partition-id": 1, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 3, "dp-eval-rounds": 1,
                 "state-dir": str(tmp_path / name)})
        s_of(send(c, content(1, q=q1, y=y1)))
        out.append(s_of(send(c, content(2, v=v, q_norm=1.0))))
    assert np.array_equal(out[0], out[1])


def test_a_party_refuses_the_target_where_it_does_not_apply(tmp_path):
    (q1, y1), (q2, y2), _ = rounds(2)
    c = ctx({"partition-id": 0})
    s_of(send(c, content(1, q=q1, y=y1)))
    v = x_update_target(np.zeros(N), q2, y2, RHO, THETA)[1]
    assert reason(send(copy.deepcopy(c), content(2, alpha=1.5, v=v, q_norm=1.0))) == (
        "party 0: vectors['v'] (the x-update target alone) with config['alpha']=1.5; the target is sent alone at "
        "alpha = 1 only, else q and y; refused, nothing charged")
    assert reason(send(copy.deepcopy(c), content(2, v=v, q_norm=-1.0))) == (
        "party 0: config['q_norm']=-1.0 is a norm; it must be >= 0; refused, nothing charged")
    assert reason(send(copy.deepcopy(c), content(2, v=v))) == "message field config['q_norm'] is missing"
    # a private party's final update (an evaluate request) reads q and y: v alone is not accepted there
    p = ctx({"partition-id": 1, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 0, "dp-eval-rounds": 1,
             "state-dir": str(tmp_path / "p")})
    assert reason(send(p, content(5, v=v, q_norm=1.0, final_update=True), "evaluate")) == \
        "message field vectors['q'] is missing"


def _grid_run(rc):
    seen = []
    grid = LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                     {100 + i: {"partition-id": i} for i in range(2)}, rc,
                     on_reply=lambda msg, rep: seen.append(msg))
    st = sa.make_strategy(rc)
    st.start(grid)
    return st, [travelled(m.content) for m in seen if m.metadata.message_type == "train"]


@pytest.mark.parametrize("acceleration", ["none", "auto"])
def test_each_train_request_after_round_one_carries_one_vector_and_the_run_is_unchanged(acceleration, monkeypatch):
    """In process (LocalGrid: the real strategy, exchange and handlers): round 1 sends q and y
    (no release held yet), every later train request v alone (8 N bytes of values, not 16 N;
    per party under Anderson acceleration), and every round's numbers are bitwise those of the
    same run sending q and y."""
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 8, "tol": 0.0, "acceleration": acceleration}
    st, train = _grid_run(rc)
    keys = [sorted(rd["vectors"].keys()) for rd in train]
    assert keys == [["q", "y"]] * 2 + [["v"]] * 2 * 7
    assert all(rd["vectors"]["v"].numpy().nbytes == 8 * N for rd in train[2:])
    from flower_vfl.strategies import sums, vertical_admm
    monkeypatch.setattr(vertical_admm, "sends_target", lambda st, party: False)
    monkeypatch.setattr(sums, "sends_target", lambda st, party: False)
    ref, train_qy = _grid_run(rc)
    assert [sorted(rd["vectors"].keys()) for rd in train_qy] == [["q", "y"]] * 2 * 8
    cols = ("objective", "train_loss", "primal_residual", "dual_residual", "rho")
    assert np.array_equal(np.array([[r[c] for c in cols] for r in st.history_]),
                          np.array([[r[c] for c in cols] for r in ref.history_]))
