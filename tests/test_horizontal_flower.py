"""Horizontal DP inexact ADMM through Flower Messages (in process, LocalGrid) against the
in-process engine, and the agent's trust boundary (node-config privacy, replays, its one
ledger). The engine comparisons give the agent objects the engine's seeds (``seed=``, an
in-process experiment); a ClientApp agent has none (tests/test_horizontal_budget.py)."""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result

from flower_vfl.clients import DPIADMMClient
from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
from flower_vfl.config.schema import ConfigError
from flower_vfl.horizontal import DPIADMMParams, run_dpiadmm
from flower_vfl.horizontal.data import split_arrays
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.strategies import DPIADMMStrategy

P, K = 4, 3


@pytest.fixture(scope="module")
def data():
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    keep = y < K
    X, y = X[keep] / 16.0, y[keep]                        # pixels in [0, 1]
    Xtr, ytr, Xte, yte = X[:450], y[:450], X[450:], y[450:]
    Xp, yp = split_arrays(Xtr, ytr, P, "iid")
    return Xp, yp, Xte, yte


# a node-level budget no test here reaches; eq. (20), the in-process engine's (the paper's) calibration,
# so the Flower path is compared with the engine (an agent's own default is 'replace')
CAP = {"dp-max-epsilon": 1e3, "dp-sensitivity": "eq20"}


def started(st, grid):
    """``st`` after Flower's ``start(grid, initial_arrays)`` (its Result checked against ``st``)."""
    res = st.start(grid, ArrayRecord())
    assert isinstance(res, Result)
    assert sorted(res.train_metrics_clientapp) == [row["t"] for row in st.history_]
    if st.history_:
        np.testing.assert_array_equal(res.arrays["w"].numpy(), st.w)
    return st


def _grid(data, node_cfg, replay=False, seeds=None):
    Xp, yp, *_ = data
    clients = {}

    def client(ctx):
        pid = int(ctx.node_config["partition-id"])
        if pid not in clients:
            clients[pid] = DPIADMMClient(pid, Xp[pid], yp[pid], K, agent_privacy_from_node_config(ctx.node_config),
                                         seed=None if seeds is None else seeds[pid])
        return clients[pid]

    def train(msg, ctx):
        rep = client(ctx).train(msg, ctx)
        if replay:                                         # every round is delivered twice
            again = client(ctx).train(msg, ctx)
            np.testing.assert_array_equal(again.content["release"]["z"].numpy(), rep.content["release"]["z"].numpy())
        return rep

    handlers = {"train": train, "query.identify": lambda m, c: client(c).identify(m, c)}
    return LocalGrid(handlers, {100 + i: {"partition-id": i, **node_cfg(i)} for i in range(P)})


@pytest.mark.parametrize("variant, eps", [("objt", 0.5), ("objp", 1.0), ("outp", 0.5), ("objt", None)])
def test_flower_path_equals_engine(data, variant, eps):
    Xp, yp, Xte, yte = data
    T, seeds = 25, [11, 22, 33, 44]
    cfg = (lambda i: {"dp-eps-bar": eps, **CAP}) if eps else (lambda i: {})
    st = started(DPIADMMStrategy(variant, P, Xp[0].shape[1], K, T, a=1.0, beta=1e-4, X_test=Xte, y_test=yte,
                         eval_every=5), _grid(data, cfg, replay=True, seeds=seeds))
    res = run_dpiadmm(Xp, yp, DPIADMMParams(variant=variant, eps_bar=eps, beta=1e-4), T, [seeds], K=K,
                      X_test=Xte, y_test=yte, eval_every=5, stream=1)     # LocalGrid's run id is 1
    assert np.max(np.abs(st.w - res.W[0])) <= 1e-9
    assert np.max(np.abs(st.Z - res.Z[0])) <= 1e-9
    assert np.max(np.abs(st.Lam - res.Lam[0])) <= 1e-9      # the server's duals = the engine's
    errs = [h["test_error"] for h in res.history if h["t"] == T]
    assert st.history_[-1]["test_error"] == pytest.approx(errs[0], abs=1e-12)
    if eps:
        for p in range(P):
            rep = st.privacy_[p]["totals"]
            ref = res.privacy(1e-5)[p]
            assert rep["releases"] == T and rep["epsilon_basic"] == pytest.approx(T * eps)
            assert rep["epsilon_pld"] == pytest.approx(ref["epsilon_pld"], rel=1e-9)
            assert rep["epsilon_pld"] < rep["epsilon_basic"]


def test_agent_duals_match_server(data):
    Xp, *_ = data
    grid = _grid(data, lambda i: {"dp-eps-bar": 1.0, **CAP})
    st = started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 6, beta=1e-4), grid)
    for nid, ctx in grid.contexts.items():
        lam_agent = ctx.state["hz.agent"]["lam"].numpy()
        np.testing.assert_allclose(lam_agent, st.Lam[st.node_to_agent[nid]], atol=1e-12)


def test_privacy_comes_from_node_config_and_no_seed_is_accepted(data):
    """The server's messages cannot set eps_bar; an agent's node config cannot give it a seed
    (refused, naming the key); and replies carry nothing but identity, release and report."""
    Xp, *_ = data
    with pytest.raises(ConfigError, match=r"^agent 2: node config key 'dp-seed'=987654321 is refused: an agent "
                                          r"draws its noise from OS entropy only"):
        agent_privacy_from_node_config({"partition-id": 2, "dp-eps-bar": 0.5, "dp-seed": 987654321, **CAP})
    seen = []
    grid = _grid(data, lambda i: {"dp-eps-bar": 0.5, **CAP})
    grid.on_reply = lambda m, r: seen.append(r)
    st = started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 3, beta=1e-4), grid)
    assert st.params.eps_bar == 0.5
    for rep in seen:
        assert set(rep.content.keys()) <= {"identity", "release", "privacy"}
        if "privacy" in rep.content:
            assert "seed" not in str(rep.content["privacy"]["report"])


def test_replay_of_an_old_round_is_refused(data):
    Xp, yp, *_ = data
    grid = _grid(data, lambda i: {"dp-eps-bar": 1.0, **CAP})
    started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 3, beta=1e-4), grid)
    ctx = grid.contexts[100]
    msg = Message(RecordDict({"config": ConfigRecord({"t": 2, "rho": 7.0, "variant": "objt", "a": 1.0,
                                                      "beta": 1e-4, "box": 1.0, "trust": "paper", "I": 450,
                                                      "P": P})}), dst_node_id=100, message_type="train")
    from flwr.app import Array, ArrayRecord
    msg.content["arrays"] = ArrayRecord({"w": Array(np.zeros((Xp[0].shape[1], K)))})
    rep = DPIADMMClient(0, Xp[0], yp[0], K, agent_privacy_from_node_config(ctx.node_config)).train(msg, ctx)
    assert rep.content["refusal"]["reason"] == ("agent 0: round t=2 is not after the last answered round 3; "
                                                "rounds must increase")


def test_agents_with_different_eps_bar_are_rejected(data):
    Xp, *_ = data
    with pytest.raises(ValueError, match=r"the agents' eps_bar differ"):
        started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 2), 
            _grid(data, lambda i: {"dp-eps-bar": 1.0 if i else 2.0, **CAP}))


# ---------------------------------------------------------------- item 8: the agent's disk
def _store_grid(data, tmp_path, node_cfg, run_id=1, seeds=None):
    from flower_vfl.privacy.store import PartyStore
    Xp, yp, *_ = data
    stores = {i: PartyStore(tmp_path / f"agent{i}") for i in range(P)}

    def client(ctx):
        pid = int(ctx.node_config["partition-id"])
        return DPIADMMClient(pid, Xp[pid], yp[pid], K, agent_privacy_from_node_config(ctx.node_config),
                             store=stores[pid], seed=None if seeds is None else seeds[pid])   # fresh per message

    handlers = {"train": lambda m, c: client(c).train(m, c),
                "query.identify": lambda m, c: client(c).identify(m, c)}
    grid = LocalGrid(handlers, {100 + i: {"partition-id": i, **node_cfg(i)} for i in range(P)})
    for ctx in grid.contexts.values():
        ctx.run_id = run_id
    return grid, stores


def test_ledger_persists_across_runs_and_caps_the_total(data, tmp_path):
    """Two runs of 3 rounds each on the same data: the second run's report shows the
    composed total over all 6 releases (the one ledger's PLD). A third run with a
    dp-max-epsilon between the 7- and 8-release totals gets one round, then the agents refuse
    and the server stops cleanly."""
    from flower_vfl.privacy import epsilon_for_events
    Xp, *_ = data
    cfg = lambda i: {"dp-eps-bar": 0.5, **CAP}  # noqa: E731
    started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 3, beta=1e-4), _store_grid(data, tmp_path, cfg, 1)[0])
    st2 = started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 3, beta=1e-4), _store_grid(data, tmp_path, cfg, 2)[0])
    rep = st2.privacy_[0]
    assert rep["totals"]["releases"] == 3 and rep["totals"]["epsilon_basic"] == pytest.approx(1.5)
    assert rep["totals_all_runs"]["releases"] == 6 and rep["totals_all_runs"]["mechanisms"] == {"laplace": 6}
    total = lambda n: epsilon_for_events([("laplace", 2.0)] * n, 1e-5, "pld")  # noqa: E731   z = 1/eps_bar
    assert rep["totals_all_runs"]["epsilon_pld"] == pytest.approx(total(6), rel=1e-5)
    assert rep["totals_all_runs"]["epsilon_pld"] < 3.0                 # below basic composition 6 x 0.5
    cap = (total(7) + total(8)) / 2
    grid3, _ = _store_grid(data, tmp_path, lambda i: {"dp-eps-bar": 0.5, "dp-max-epsilon": cap}, 3)
    st3 = started(DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 3, beta=1e-4), grid3)
    assert f"above its dp-max-epsilon={cap:g}; already spent epsilon={total(7):.4g} over 7 release(s); " \
           "refused" in st3.stopped_reason_
    assert len(st3.history_) == 1                            # one round, nothing past the cap


def test_restarted_agent_replays_from_disk_and_resumes(data, tmp_path):
    """A node that loses its memory (fresh context.state) after round 2 gets round 2 again:
    it answers from its disk (no second draw, one ledger row), then continues; the run ends
    where an uninterrupted run ends."""
    Xp, *_ = data
    cfg = lambda i: {"dp-eps-bar": 1.0, **CAP}  # noqa: E731
    seeds = [77, 78, 79, 80]                                # the same draws in both runs (in-process)
    ref = started(DPIADMMStrategy("objp", P, Xp[0].shape[1], K, 5, beta=1e-4), 
        _store_grid(data, tmp_path / "a", cfg, seeds=seeds)[0])
    grid, stores = _store_grid(data, tmp_path / "b", cfg, seeds=seeds)
    handler = grid.handlers["train"]
    calls = {"n": 0}

    def flaky(msg, ctx):
        rep = handler(msg, ctx)
        if int(msg.content["config"]["t"]) == 2 and ctx.node_id == 100 and calls["n"] == 0:
            calls["n"] += 1
            from flwr.app import RecordDict as RD
            ctx.state = RD()                                  # the SuperNode restarted
            again = handler(msg, ctx)                        # the server re-sent round 2
            np.testing.assert_array_equal(again.content["release"]["z"].numpy(),
                                          rep.content["release"]["z"].numpy())
        return rep

    grid.handlers["train"] = flaky
    st = started(DPIADMMStrategy("objp", P, Xp[0].shape[1], K, 5, beta=1e-4), grid)
    assert calls["n"] == 1
    np.testing.assert_allclose(st.w, ref.w, atol=1e-12)
    client = DPIADMMClient(0, Xp[0], data[1][0], K, agent_privacy_from_node_config(cfg(0)), store=stores[0])
    assert [e["t"] for e in client.releases()] == [1, 2, 3, 4, 5]


def test_flwr_datasets_splits_cover_the_rows_once():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 6000)
    X = rng.uniform(size=(6000, 3))
    Xp, yp = split_arrays(X, y, 10, "iid")
    assert [len(v) for v in yp] == [600] * 10
    np.testing.assert_array_equal(np.sort(np.concatenate(Xp)[:, 0]), np.sort(X[:, 0]))
    Xd, yd = split_arrays(X, y, 20, "dirichlet", alpha=0.3)
    sizes = [len(v) for v in yd]
    assert sum(sizes) == 6000 and min(sizes) >= 10 and max(sizes) > 2 * min(sizes)   # heterogeneous
    np.testing.assert_array_equal(np.sort(np.concatenate(Xd)[:, 0]), np.sort(X[:, 0]))


def test_flower_path_equals_engine_on_unequal_agents(data):
    """Dirichlet split (unequal I_p): the engine pads agents to a common size; the agents
    do not. Same iterates to 1e-9, and the eq. (20) scales agree per agent."""
    Xp, yp, Xte, yte = data
    Xd, yd = split_arrays(np.concatenate(Xp), np.concatenate(yp), P, "dirichlet", alpha=0.5)
    assert len({len(v) for v in yd}) > 1
    data_d = (Xd, yd, Xte, yte)
    seeds = [5, 6, 7, 8]
    st = started(DPIADMMStrategy("objp", P, Xd[0].shape[1], K, 15, beta=1e-4), 
        _grid(data_d, lambda i: {"dp-eps-bar": 0.7, **CAP}, seeds=seeds))
    res = run_dpiadmm(Xd, yd, DPIADMMParams(variant="objp", eps_bar=0.7, beta=1e-4), 15, [seeds], K=K, stream=1)
    assert np.max(np.abs(st.Z - res.Z[0])) <= 1e-9
    for p in range(P):
        assert st.privacy_[p]["totals"]["epsilon_pld"] == pytest.approx(res.privacy()[p]["epsilon_pld"], rel=1e-9)


def test_start_keeps_flowers_contract(data):
    """Flower's ``Strategy.start``: num_rounds overrides T, the Result holds the final w and each
    round's row; evaluate_fn sees w after every round (its metrics in evaluate_metrics_serverapp);
    an initial w is the first w the agents receive; settings Flower would send to the agents are refused."""
    Xp, *_ = data
    J = Xp[0].shape[1]
    cfg = lambda i: {"dp-eps-bar": 1.0, **CAP}  # noqa: E731
    seen = []

    def evaluate_fn(t, arrays):
        seen.append((t, arrays["w"].numpy().copy()))
        return MetricRecord({"w_norm": float(np.abs(arrays["w"].numpy()).sum())})

    st = DPIADMMStrategy("objt", P, J, K, 9, beta=1e-4)
    res = st.start(_grid(data, cfg, seeds=[1, 2, 3, 4]), ArrayRecord(), num_rounds=3, evaluate_fn=evaluate_fn)
    assert len(st.history_) == 3 and [t for t, _ in seen] == [1, 2, 3]
    np.testing.assert_array_equal(seen[-1][1], res.arrays["w"].numpy())
    assert res.evaluate_metrics_serverapp[3]["w_norm"] == pytest.approx(float(np.abs(st.w).sum()), rel=1e-12)
    assert dict(res.train_metrics_clientapp[2]) == {k: float(v) for k, v in st.history_[1].items()}
    # an initial w is the first w the agents receive (the paper's default: w^1 = 0)
    w0 = np.full((J, K), 0.01)
    sent = []
    grid0 = _grid(data, cfg, seeds=[1, 2, 3, 4])
    grid0.on_reply = lambda m, r: sent.append(m.content["arrays"]["w"].numpy()) if m.metadata.message_type == "train" \
        else None
    DPIADMMStrategy("objt", P, J, K, 1, beta=1e-4).start(grid0, ArrayRecord({"w": Array(w0)}))
    assert len(sent) == P and all(np.array_equal(w, w0) for w in sent)
    sent.clear()
    grid0 = _grid(data, cfg, seeds=[1, 2, 3, 4])
    grid0.on_reply = lambda m, r: sent.append(m.content["arrays"]["w"].numpy()) if m.metadata.message_type == "train" \
        else None
    DPIADMMStrategy("objt", P, J, K, 1, beta=1e-4).start(grid0, ArrayRecord())
    assert len(sent) == P and all(not w.any() for w in sent)
    with pytest.raises(ValueError, match=r"^train_config holds \['lr'\]; an agent takes only the protocol's t, "
                                         r"rho_t and the strategy's public settings \(a, beta, box, trust\): pass None$"):
        DPIADMMStrategy("objt", P, J, K, 2).start(_grid(data, cfg), ArrayRecord(), train_config=ConfigRecord({"lr": 1.0}))
    with pytest.raises(ValueError, match=rf"^initial_arrays\['w'\] has shape \(2, 2\); expected finite \({J}, {K}\)$"):
        DPIADMMStrategy("objt", P, J, K, 2).start(_grid(data, cfg), ArrayRecord({"w": Array(np.zeros((2, 2)))}))
    with pytest.raises(ValueError, match=r"^num_rounds=0; expected an integer >= 1 \(iterations T\)$"):
        DPIADMMStrategy("objt", P, J, K, 2).start(_grid(data, cfg), ArrayRecord(), num_rounds=0)
