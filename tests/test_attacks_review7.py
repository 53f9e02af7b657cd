"""Adversarial review of the horizontal agent (DP inexact ADMM: ObjP, ObjT, OutP) through the real
ClientApp handlers of :mod:`flower_vfl.apps.horizontal`, a fresh Flower ``Context`` per message, a
malicious server choosing every message field. The loader is patched to small in-memory data
(features in [0, 1] unless a test says otherwise) so a message costs milliseconds."""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import horizontal as hz
from flower_vfl.privacy.boundary import InvalidMessage
from flower_vfl.privacy.store import PartyStore

DATA = {}


@pytest.fixture(autouse=True)
def loader(monkeypatch):
    from sklearn.datasets import load_digits
    import flower_vfl.datasets as ds
    X, y = load_digits(return_X_y=True)
    DATA["d"] = (X / 16.0, y, X[:50] / 16.0, y[:50])
    monkeypatch.setattr(ds, "load_fashion_mnist", lambda data_dir=None: DATA["d"])
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def node(tmp_path, **kw):
    return {"partition-id": 0, "data-dir": str(tmp_path / "fmnist"), "state-dir": str(tmp_path / "agent0"),
            "dp-eps-bar": 0.5, "dp-max-epsilon": 1e3, "dp-sensitivity": "replace", **kw}


def context(nc, run, rc=None):
    return Context(run_id=run, node_id=9, node_config=dict(nc), state=RecordDict(),
                   run_config=dict({"hz-num-agents": 1, "hz-split": "iid"} if rc is None else rc))


def message(w, **cfg):
    base = {"t": 1, "rho": 5.0, "variant": "objt", "a": 1.0, "beta": 1e-4, "box": 1.0, "trust": "paper",
            "I": len(DATA["d"][1]), "P": 1, "final": False}
    base.update(cfg)
    rd = RecordDict({"config": ConfigRecord(base), "arrays": ArrayRecord({"w": Array(np.asarray(w, dtype=float))})})
    return Message(rd, dst_node_id=9, message_type="train")


def rows(nc):
    store = PartyStore(nc["state-dir"])
    out = [r for src, _ in store.sources() for r in store.entries(src)]
    store.close()
    return out


J, K = 64, 10
Z_GAUSS = math.sqrt(2 * math.log(1.25 / 1e-6))          # OutP's multiplier times eps_bar (delta_bar 1e-6)


@pytest.mark.parametrize("variant", ["objp", "objt", "outp"])
def test_server_scalars_never_move_the_charged_multiplier_or_the_sensitivity(tmp_path, variant):
    """Any rho (tiny, huge), a huge finite w, huge a/box, a constant trust region, beta 0, the
    largest I: every release is charged at the calibration's multiplier (Laplace 1/eps_bar, Gaussian
    sqrt(2 ln(1.25/delta_bar))/eps_bar) with the closed-form sensitivity (replace: 4 J / I; OutP:
    2 c1 / (I (rho + 1/eta))), i.e. the server's values are post-processing of a bounded update."""
    nc = node(tmp_path)
    I0 = len(DATA["d"][1])
    cases = [dict(rho=1e-300), dict(rho=1e12), dict(rho=5.0, a=1e12, box=1e12, trust="constant", beta=0.0),
             dict(rho=1e12, I=10**12), dict(rho=5.0, t=10**6)]
    ws = [np.zeros((J, K)), np.full((J, K), 1e300), np.full((J, K), -1e300), np.zeros((J, K)), np.ones((J, K))]
    for run, (cfg, w) in enumerate(zip(cases, ws), start=1):
        rep = hz.train(message(w, variant=variant, **cfg), context(nc, run))
        assert "release" in rep.content, rep.content
    got = rows(nc)
    assert len(got) == len(cases)
    for r, cfg in zip(got, cases):
        I = cfg.get("I", I0)
        if variant == "outp":
            assert r.mechanism == "gaussian"
            assert r.noise_multiplier == pytest.approx(Z_GAUSS / 0.5, rel=1e-6)
            assert r.sigma == pytest.approx(r.sensitivity * Z_GAUSS / 0.5, rel=1e-12)
        else:
            assert r.mechanism == "laplace"
            assert r.noise_multiplier == pytest.approx(1 / 0.5, rel=1e-6)
            assert r.sensitivity == pytest.approx(4.0 * J / I, rel=1e-12)


@pytest.mark.parametrize("field, cfg, w, msg", [
    ("rho", dict(rho=0.0), None, "agent 0: config['rho']=0.0 is outside the protocol's range (0, 1e+12]; "
                                  "refused, nothing charged"),
    ("rho", dict(rho=float("inf")), None, "agent 0: config['rho']=inf is outside the protocol's range (0, 1e+12]; "
                                           "refused, nothing charged"),
    ("I", dict(I=10), None, "agent 0: config['I']=10 must be an integer in 1797..1000000000000 (at least this "
                            "agent's 1797 samples); refused, nothing charged"),
    ("w", {}, np.full((J, K), np.nan), "agent 0: arrays['w'] has shape (64, 10) (float64); expected finite (64, 10)"),
    ("w", {}, np.full((J, K), np.inf), "agent 0: arrays['w'] has shape (64, 10) (float64); expected finite (64, 10)"),
])
def test_non_finite_or_out_of_range_server_values_are_refused_before_any_charge(tmp_path, field, cfg, w, msg):
    nc = node(tmp_path)
    with pytest.raises(InvalidMessage) as exc:
        hz.train(message(np.zeros((J, K)) if w is None else w, **cfg), context(nc, 1))
    assert str(exc.value) == msg
    assert rows(nc) == []


def test_a_re_sent_round_in_a_fresh_context_gets_the_stored_answer_not_a_fresh_draw(tmp_path):
    """Averaging attack: the same (run, t) sent 5 times, each in a fresh Context (a restarted
    node), with other w/rho: the same bytes every time and one ledger row; an older t is refused."""
    nc = node(tmp_path)
    first = hz.train(message(np.zeros((J, K))), context(nc, 1)).content["release"]["z"].numpy()
    for k in range(5):
        again = hz.train(message(np.full((J, K), 0.1 * k), rho=1.0 + k), context(nc, 1))
        np.testing.assert_array_equal(again.content["release"]["z"].numpy(), first)
    assert len(rows(nc)) == 1
    assert "release" in hz.train(message(np.zeros((J, K)), t=3), context(nc, 1)).content
    old = hz.train(message(np.zeros((J, K)), t=2), context(nc, 1))
    assert str(old.content["refusal"]["reason"]) == ("agent 0: round t=2 is not after the last answered round 3; "
                                                     "rounds must increase")
    assert [r.round for r in rows(nc)] == [1, 3]


@pytest.mark.parametrize("key, value", [("dp-eps-bar", 100.0), ("dp-max-epsilon", 1e9), ("dp-sensitivity", "eq20"),
                                        ("dp-x-l1-max", 1e-3), ("dp-delta", 0.5)])
def test_the_run_config_cannot_set_the_agents_privacy(tmp_path, key, value):
    from flower_vfl.config.schema import ConfigError
    nc = node(tmp_path)
    with pytest.raises(ConfigError) as exc:
        hz.train(message(np.zeros((J, K))), context(nc, 1, rc={"hz-num-agents": 1, "hz-split": "iid", key: value}))
    assert key in str(exc.value)
    assert rows(nc) == []


def test_rows_outside_the_calibrations_bounds_are_brought_inside_before_any_release(tmp_path):
    """Before: 'replace' charged 4 x_l1_max / I and OutP's c1 assumed ||x||_2^2 <= ||x||_1 <= x_l1_max,
    but nothing held the agent's own rows to it: with raw 0..16 digits pixels in its files and
    dp-x-l1-max = 5, rows reached ||x||_1 = 433, so a label flip moved f_p' by 866/I against the
    charged 4*5/I (43x, measured). Now a private agent clips features to [0, 1] and
    scales rows onto the l1 ball: every label flip moves f_p' by at most the charged sensitivity."""
    from flower_vfl.horizontal.model import local_gradient
    X, y, Xt, yt = DATA["d"]
    DATA["d"] = (X * 16.0, y, Xt, yt)                 # raw 0..16 pixels in the agent's own files
    nc = node(tmp_path, **{"dp-x-l1-max": 5.0})
    ctx = context(nc, 1)
    agent = hz.make_agent(ctx)
    assert agent.X.min() >= 0.0 and agent.X.max() <= 1.0 and agent.X.sum(axis=1).max() <= 5.0
    inside = (X * 16.0).clip(0, 1).sum(axis=1) <= 5.0   # rows already inside: unchanged bit for bit
    np.testing.assert_array_equal(agent.X[inside], (X * 16.0).clip(0, 1)[inside])
    rep = hz.train(message(np.zeros((J, K))), ctx)
    assert "release" in rep.content
    (r,) = rows(nc)
    I = len(y)
    assert r.sensitivity == pytest.approx(4 * 5.0 / I, rel=1e-12)
    Y = np.eye(K)[agent.y]
    z = np.zeros((J, K))
    g = local_gradient(z, agent.X, Y, I, 1e-4, 1)
    worst = 0.0
    for i in np.argsort(-agent.X.sum(axis=1))[:20]:     # label flips of the heaviest rows
        for k in range(K):
            Y2 = Y.copy()
            Y2[i] = np.eye(K)[k]
            worst = max(worst, np.abs(local_gradient(z, agent.X, Y2, I, 1e-4, 1) - g).sum())
    assert worst <= r.sensitivity * (1 + 1e-9)
    assert worst == pytest.approx(2 * agent.X.sum(axis=1).max() / I, rel=1e-9)   # closed form: 2||x_i||_1 / I


@pytest.mark.xfail(strict=True, reason="open for an agent that opts into dp-sensitivity='eq20' (the paper's; the default is 'replace' since "
                   "review 7): eq20 scales the "
                   "noise by the data at a z the server steers; at a z where every own sample is fitted exactly "
                   "the scale is 0, the release is the noise-free formula and is charged nothing, while a "
                   "neighbour (one label flipped) gets noise: certain distinction, infinite loss, 0 charged")
def test_eq20_scale_cannot_be_driven_to_zero_by_the_server(tmp_path):
    """The server steers the agent's z onto its w in one round (ObjT, trust='constant', a and box
    1e12, rho 1e12), with w fitting each own row with a 1000-logit margin (exp underflows: h - y = 0
    exactly), then asks round 2 with beta 0: the agent's Laplace scale is eq. (20)'s max
    ||x||_1 ||h - y||_1 / I = 0."""
    n = 12
    X = np.eye(n, J)                                   # row i: pixel i lit (features in [0, 1])
    y = np.arange(n) % K
    DATA["d"] = (X, y, X, y)
    W = np.zeros((J, K))
    W[np.arange(n), y] = 1000.0
    nc = node(tmp_path, **{"dp-sensitivity": "eq20"})
    steer = dict(variant="objt", trust="constant", a=1e12, box=1e12, rho=1e12, beta=0.0, I=n)
    ctx = context(nc, 1)
    z1 = hz.train(message(W, t=1, **steer), ctx).content["release"]["z"].numpy()
    z2 = hz.train(message(W, t=2, **steer), ctx).content["release"]["z"].numpy()
    lam1 = 1e12 * (W - z1)
    noise_free = W + (lam1 - 0.0 - 0.0) / 1e12          # objt_step with xi = 0, G = 0
    r2 = rows(nc)[-1]
    assert np.array_equal(z2, noise_free) and r2.noise_multiplier == 0.0 and r2.sensitivity == 0.0   # the attack
    y2 = y.copy()
    y2[0] = (y[0] + 1) % K                             # the neighbour: one label flipped
    DATA["d"] = (X, y2, X, y2)
    nb = node(tmp_path / "neighbour", **{"dp-sensitivity": "eq20"})
    ctx = context(nb, 1)
    z1b = hz.train(message(W, t=1, **steer), ctx).content["release"]["z"].numpy()
    z2b = hz.train(message(W, t=2, **steer), ctx).content["release"]["z"].numpy()
    assert not np.array_equal(z2b, W + (1e12 * (W - z1b)) / 1e12) and rows(nb)[-1].noise_multiplier > 0
    # the safe property: round 2 carries noise or is charged
    assert not np.array_equal(z2, noise_free) or r2.noise_multiplier > 0


@pytest.mark.xfail(strict=True, reason="open hole (review 7): the run config's hz-num-agents / hz-split choose "
                   "which individuals each agent holds, and each agent's ledger is keyed by its partition-id: "
                   "the server spreads one individual over every agent's ledger (P x dp-max-epsilon). Fix: the "
                   "partitioning (num-partitions, split, alpha) from the node config, the run config refused "
                   "when it differs")
def test_the_server_cannot_put_one_individual_in_two_agents_ledgers(tmp_path):
    """Two agents (partition-id 0 and 1) with their own disks, dp-max-epsilon 0.6 at eps_bar 0.5
    (one Laplace release each: PLD eps 0.5; two: above 0.6). Run 1 with hz-num-agents 2: agent 1
    holds the last row; run 2 with hz-num-agents 1: agent 0 holds every row, the last one too.
    Both release it, each charged in its own ledger: that individual's loss composes two releases."""
    from flower_vfl.horizontal.data import split_indices
    from flower_vfl.privacy import epsilon_for_events
    y = DATA["d"][1]
    last = len(y) - 1
    assert last in split_indices(y, 2, "iid")[1] and last in split_indices(y, 1, "iid")[0]
    same = {"data-dir": str(tmp_path / "fmnist"), "dp-max-epsilon": 0.6}          # one copy of the data
    a0 = node(tmp_path / "a0", **{"partition-id": 0, **same})
    a1 = node(tmp_path / "a1", **{"partition-id": 1, **same})
    r1 = hz.train(message(np.zeros((J, K)), P=2), context(a1, 1, rc={"hz-num-agents": 2, "hz-split": "iid"}))
    r2 = hz.train(message(np.zeros((J, K)), P=1), context(a0, 2, rc={"hz-num-agents": 1, "hz-split": "iid"}))
    assert "release" in r1.content and "release" in r2.content                 # the attack
    two = epsilon_for_events([("laplace", 2.0)] * 2, 1e-5, "pld")
    assert two > 0.6                                                            # the individual's true loss
    charged = [epsilon_for_events([(r.mechanism, r.noise_multiplier) for r in rows(nc)], 1e-5, "pld")
               for nc in (a0, a1)]
    assert max(charged) <= 0.6 < two
    # the safe property: a release of the same individual composes in one budget
    assert len(rows(a0)) + len(rows(a1)) <= 1


@pytest.mark.xfail(strict=True, reason="open gap (review 7): a horizontal agent reserves no plan and resumes only "
                   "within a run id; a server that crashes and starts the same computation again as a new run "
                   "is charged again for rounds it already received (the vertical routes reuse the stored draw). "
                   "Note tests/test_horizontal_budget.py::test_an_agent_draws_fresh_noise_in_every_run asserts "
                   "today's fresh draw for an identical first message of another run")
def test_a_restarted_run_of_the_same_computation_does_not_burn_the_budget_again(tmp_path):
    """A deterministic server sends rounds 1..3 (w = the agent's last release), crashes, and runs
    the same computation again under a new run id: every message of the re-run equals one already
    answered, so the stored answers would do (post-processing); today each is a fresh, charged draw."""
    nc = node(tmp_path)

    def run(run_id):
        ctx, w, out = context(nc, run_id), np.zeros((J, K)), []
        for t in (1, 2, 3):
            w = hz.train(message(w, t=t), ctx).content["release"]["z"].numpy()
            out.append(w)
        return out

    first, again = run(1), run(2)
    assert len(rows(nc)) == 3
    np.testing.assert_array_equal(np.stack(first), np.stack(again))


def test_an_agents_default_sensitivity_is_the_data_independent_one():
    """The default a malicious server cannot steer: an agent that names no dp-sensitivity calibrates to
    'replace' (eq. (20), the paper's, is data-dependent: the strict xfail above); 'eq20' only when its
    node config says so."""
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    assert agent_privacy_from_node_config({"partition-id": 0, "dp-eps-bar": 1.0,
                                           "dp-max-epsilon": 10.0})["sensitivity"] == "replace"
    assert agent_privacy_from_node_config({"partition-id": 0, "dp-eps-bar": 1.0, "dp-max-epsilon": 10.0,
                                           "dp-sensitivity": "eq20"})["sensitivity"] == "eq20"
