"""A fifth adversarial review of the party side: "a crash, a full disk or a second run must never burn
a party's budget without a model", and the party's own disk state against a malicious central node.
Through the real ClientApp handlers (``flower_vfl.apps.client``), a fresh Flower ``Context`` per run,
the party's own state-dir; the store's clock is moved by hand (no sleeping). Each test is an attack the
earlier reviews (test_attacks_review.py .. test_attacks_review4.py, test_failure_budget.py,
test_ledger_plans.py) did not make, with what the party must do.
"""

import json
import types

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from _party_handlers import _task_identity  # noqa: F401  (autouse)
from flower_vfl.apps import client as ca
from flower_vfl.privacy import store as store_mod
from flower_vfl.privacy.accounting import epsilon_for_events
from flower_vfl.privacy.store import party_store

RC2 = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-3, "secagg": False}
EXPIRY = 100.0


@pytest.fixture
def clock(monkeypatch):
    """The store's clock (plans' activity and lapses), moved by hand."""
    now = [1_700_000_000.0]
    real = store_mod.time
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(
        time=lambda: now[0], monotonic=real.monotonic, sleep=real.sleep, strftime=real.strftime))
    store_mod.OPEN_STORES.clear()
    yield now
    store_mod.OPEN_STORES.clear()


def _node(tmp_path, **kw):
    return {"partition-id": 0, "state-dir": str(tmp_path / "s0"), "dp": True, "dp-epsilon": 1.0,
            "dp-train-rounds": 2, "dp-eval-rounds": 1, "dp-plan-expiry": EXPIRY, **kw}


def _ctx(node, run_id):
    return Context(run_id=run_id, node_id=100, node_config=dict(node), state=RecordDict(), run_config=dict(RC2))


def _identify(c, token=None):
    cfg = {"want": "party", **({"plans": json.dumps({"0": token})} if token else {})}
    rep = ca.identify(Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=c.node_id,
                              message_type="query.identify"), c)
    return rep.content["identity"]


def _broadcast(seed=5):
    from flower_vfl.io.data import party_block
    n = party_block("breast_cancer", 0, 2)[0].shape[0]
    rng = np.random.default_rng(seed)
    return rng.normal(size=n) * 0.1, rng.normal(size=n) * 1e-3


def _vectors(q, y):
    return ArrayRecord({"q": Array(np.asarray(q, float)), "y": Array(np.asarray(y, float))})


def _train(c, rnd, seed=5):
    q, y = _broadcast(seed)
    rd = RecordDict({"vectors": _vectors(q, y),
                     "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 0.5})})
    return ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content


def _final(c, rnd, seed=5):
    q, y = _broadcast(seed)
    rd = RecordDict({"vectors": _vectors(q, y), "config": ConfigRecord(
        {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 0.5, "final_update": True})})
    return ca.evaluate(Message(rd, dst_node_id=c.node_id, message_type="evaluate"), c).content


def _src(node):
    st = party_store(node["state-dir"])
    (src, _), = st.sources()
    return st, src


def _plans(node):
    st, src = _src(node)
    return {p.plan: p.status for p in st.plans(src)}


def _entries(node):
    st, src = _src(node)
    return [(e.run, e.round, e.kind) for e in st.entries(src)]


# ------------------------------------------------------------------ renewing a reservation without releasing
def test_identify_and_resumes_without_releases_hold_a_reservation_for_a_bounded_time(tmp_path, clock):
    """Run A's plan reserves the party's whole budget. The central node never makes a release but keeps
    the plan busy: it re-sends A's identify every 90 s (below the party's dp-plan-expiry of 100 s) and,
    from new runs B1, B2, B3, resumes A's plan with its token. Before, each of these renewed the plan's
    activity: it never lapsed, and every other run (another server, the operator's) was refused by name
    for ever, though no release was ever made (a denial of the budget). Now only the opening, a release,
    and the first resume after each (a crashed run's one honest resume) renew it: with no release the
    reservation lapses 2 x dp-plan-expiry after the opening, and run C is admitted then."""
    node = _node(tmp_path)
    A = _ctx(node, 1)
    token = _identify(A)["plan"]
    t0 = clock[0]
    for k in range(1, 4):                    # identify re-sent: renews nothing
        clock[0] = t0 + 30.0 * k
        assert _identify(A)["affordable"] is True
    clock[0] = t0 + 95.0                     # one resume: the plan's one renewal without a release
    assert _identify(_ctx(node, 11), token)["continued"] is True
    clock[0] = t0 + 190.0                    # a second resume, no release since the first: no renewal
    assert _identify(_ctx(node, 12), token)["continued"] is True
    clock[0] = t0 + 194.0                    # within 100 s of the one renewal: the reservation holds
    assert _identify(_ctx(node, 3))["affordable"] is False
    assert _plans(node) == {"1": "open"}
    clock[0] = t0 + 196.0                    # 2 x dp-plan-expiry (- the 4 s the resume waited): lapsed
    assert _identify(_ctx(node, 4))["affordable"] is True
    assert _plans(node) == {"1": "lapsed", "4": "open"}
    assert _entries(node) == []


# ------------------------------------------------------------------ a lapsed plan's own run goes on
def test_a_lapsed_plans_own_run_goes_on_only_if_its_unmade_releases_fit_again(tmp_path, clock):
    """Plan 7 (``fits`` releases at z, the whole budget) made one release and idled past dp-plan-expiry;
    plan 8 was then admitted, leaving room for exactly two more releases at z. Run 7 itself (its next
    message, or a run id the server reuses: no token needed) then goes on. Before, it was admitted with
    no check (the re-check was on the resume path only): its next two releases fit one by one and were
    charged, the third was refused, so 3 releases spent and no model. Now its first message is refused
    before anything is charged, naming the run that holds the budget, as a resume of it is; and once
    that run's reservation is released it goes on, its unmade releases reserved again."""
    from flower_vfl.privacy.ledger import Budget, BudgetReserved, Ledger
    from flower_vfl.privacy.store import PartyStore
    store = PartyStore(tmp_path)
    led = Ledger(store, "src", Budget(1.0, 1e-5), party_id=1)
    z = 10.0
    eps = [epsilon_for_events([("gaussian", z)] * k, 1e-5, "exact") for k in range(400)]
    fits = max(k for k in range(1, 400) if eps[k] <= 1.0)            # the accountant's figure, not a constant
    led.admit("7", train=fits - 1, eval=1, noise_multiplier=z, expiry=EXPIRY)
    led.commit("7", 1, "train", "h", unit="column", noise_multiplier=z, sigma=z, sensitivity=1.0, payload={})
    clock[0] += 2 * EXPIRY
    plan8, how = led.admit("8", train=fits - 3, eval=0, noise_multiplier=z, expiry=EXPIRY)
    assert how == "new" and {p.plan: p.status for p in store.plans("src")} == {"7": "lapsed", "8": "open"}
    assert eps[1 + (fits - 3) + 2] <= 1.0 < eps[1 + (fits - 3) + 3]  # room for exactly two more releases
    with pytest.raises(BudgetReserved) as refused:
        led.admit("7", train=fits - 1, eval=1, noise_multiplier=z, expiry=EXPIRY)
    assert str(refused.value) == (
        f"party 1 refuses run 7: its budget is reserved by run 8 (0 of {fits - 3} planned releases made). With "
        f"that reservation ε={eps[fits - 2]:.4g} of its budget ε=1 is taken (δ=1e-05, method='exact'; spent "
        f"ε={eps[1]:.4g}), and the lapsed plan of run 7 it resumes (1 of {fits} planned releases made, {fits - 1} "
        f"left; its reservation was given up when it lapsed) would bring it to ε={eps[2 * fits - 3]:.4g}. Wait for "
        "that run to end, or resume it (resume='<its state-dir>'); a reservation whose run made no release (nor "
        f"a first resume since) for dp-plan-expiry={EXPIRY:g} s (the party's node config) lapses")
    assert [(e.run, e.round) for e in store.entries("src")] == [("7", 1)]
    assert {p.plan: p.status for p in store.plans("src")} == {"7": "lapsed", "8": "open"}
    assert store.release_plan("src", plan8.plan)
    plan, how = led.admit("7", train=fits - 1, eval=1, noise_multiplier=z, expiry=EXPIRY)
    assert (how, plan.status) == ("attached", "open")
    assert store.reserved_events("src") == [("gaussian", z)] * (fits - 1)


# ------------------------------------------------------------------ the model after the last training release
def test_a_run_stopped_before_the_model_release_gets_the_model_later_at_the_plans_cost(tmp_path, clock):
    """The central node makes the party spend both training releases of its plan (run 1), then never
    asks for the model; it comes back after 10 x dp-plan-expiry with a resume (run 2) that asks only for
    the model. Nobody took the budget: the resume is admitted, the one model release is charged, and the
    ledger holds exactly the plan (2 training + 1 model release, ε = the budget: the accountant over the
    3 releases at the plan's z). Asked again with other vectors, from a third run, or before its final
    update, it gets the same x~ (the same scores, bit for bit) or a refusal, never a charge."""
    node = _node(tmp_path)
    A = _ctx(node, 1)
    ident = _identify(A)
    for rnd in (1, 2):
        assert "release" in _train(A, rnd)
    assert "refusal" in _train(A, 3)                 # the plan allows 2 training releases: nothing charged
    clock[0] += 10 * EXPIRY
    B = _ctx(node, 2)
    assert _identify(B, ident["plan"])["continued"] is True
    first = _final(B, 3)["release"]["s_test"].numpy()
    assert _entries(node) == [("1", 1, "train"), ("1", 2, "train"), ("1", 3, "eval")]
    assert _plans(node) == {"1": "closed"}
    st, src = _src(node)
    (z,) = {e.noise_multiplier for e in st.entries(src)}
    assert epsilon_for_events([("gaussian", z)] * 3, 1e-5, "exact") == pytest.approx(1.0, rel=1e-9)
    again = _final(B, 4, seed=9)["release"]["s_test"].numpy()
    C = _ctx(node, 3)
    assert _identify(C, ident["plan"])["continued"] is True
    third = _final(C, 7, seed=11)["release"]["s_test"].numpy()
    assert np.array_equal(first, again) and np.array_equal(first, third)
    assert len(_entries(node)) == 3


def test_a_reused_run_id_attaches_to_its_plan_and_gets_no_new_release(tmp_path, clock):
    """Run ids are the SuperLink's. A central node that reuses run id 1 after run 1's plan closed (a new
    Flower run, a fresh Context: its state forgotten) is attached to plan 1 (the ledger's key is
    str(run_id): 1 and '1' are one run): its identify is not a new plan, its training rounds are refused
    by the plan's allowance, before any x-update or charge, and its model request gets plan 1's x~ again."""
    node = _node(tmp_path)
    A = _ctx(node, 1)
    _identify(A)
    for rnd in (1, 2):
        assert "release" in _train(A, rnd)
    first = _final(A, 3)["release"]["s_test"].numpy()
    reused = _ctx(node, 1)
    ident = _identify(reused)
    assert (ident["affordable"], ident["plan_made"], ident["plan_size"]) == (True, 3, 3)
    rep = _train(reused, 5, seed=7)
    assert str(rep["refusal"]["reason"]) == (
        "party 0 refuses a train release: its plan allows 2 train release(s) per run (node config "
        "dp-train-rounds) and 2 were made in this run")
    assert np.array_equal(_final(reused, 6, seed=8)["release"]["s_test"].numpy(), first)
    assert _entries(node) == [("1", 1, "train"), ("1", 2, "train"), ("1", 3, "eval")]
    assert _plans(node) == {"1": "closed"}


def test_a_plan_its_operator_released_is_resumed_only_if_its_unmade_releases_fit_again(tmp_path, clock):
    """The party's operator released plan 7 (`flower-vfl ledger --release-plan 7`: 1 of ``fits`` releases
    made) and plan 8 then took the budget but two releases. The central node resumes plan 7 anyway, from
    run 7 itself and from a new run with its token. Before, a released plan was continued unchecked: two
    more releases charged, the third refused, no model. Now both are refused before any charge, naming
    the run holding the budget; nothing is written."""
    from flower_vfl.privacy.ledger import Budget, BudgetReserved, Ledger
    from flower_vfl.privacy.store import PartyStore
    store = PartyStore(tmp_path)
    led = Ledger(store, "src", Budget(1.0, 1e-5), party_id=1)
    z = 10.0
    eps = [epsilon_for_events([("gaussian", z)] * k, 1e-5, "exact") for k in range(400)]
    fits = max(k for k in range(1, 400) if eps[k] <= 1.0)
    plan7, _ = led.admit("7", train=fits - 1, eval=1, noise_multiplier=z, expiry=EXPIRY)
    led.commit("7", 1, "train", "h", unit="column", noise_multiplier=z, sigma=z, sensitivity=1.0, payload={})
    assert store.release_plan("src", "7")
    led.admit("8", train=fits - 3, eval=0, noise_multiplier=z, expiry=EXPIRY)
    for run, token in (("7", None), ("9", plan7.token)):
        with pytest.raises(BudgetReserved) as refused:
            led.admit(run, train=fits - 1, eval=1, noise_multiplier=z, token=token, expiry=EXPIRY)
        assert str(refused.value) == (
            f"party 1 refuses run {run}: its budget is reserved by run 8 (0 of {fits - 3} planned releases made). "
            f"With that reservation ε={eps[fits - 2]:.4g} of its budget ε=1 is taken (δ=1e-05, method='exact'; "
            f"spent ε={eps[1]:.4g}), and the released plan of run 7 it resumes (1 of {fits} planned releases made, "
            f"{fits - 1} left; its reservation was given up when the party's operator released it) would bring it "
            f"to ε={eps[2 * fits - 3]:.4g}. Wait for that run to end, or resume it (resume='<its state-dir>'); a "
            f"reservation whose run made no release (nor a first resume since) for dp-plan-expiry={EXPIRY:g} s (the party's node "
            "config) lapses")
    assert {p.plan: p.status for p in store.plans("src")} == {"7": "released", "8": "open"}
    assert store.plan_of("src", "9") is None and [(e.run, e.round) for e in store.entries("src")] == [("7", 1)]
