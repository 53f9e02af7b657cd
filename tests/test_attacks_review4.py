"""A fourth adversarial review of the party side, on the code that landed after the third: a malicious
central node (or a second run it starts beside the first) against the real ClientApp handlers
(``flower_vfl.apps.client``), a fresh Flower ``Context`` per run, each party's own state-dir.
Each test is an attack, with what the party must do: refuse before anything is charged, or charge what
a closed form says.
"""

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from _party_handlers import pinned_pair, _task_identity  # noqa: F401  (autouse)
from test_attacks_review2 import sa_adverts
from test_attacks_review3 import _dist_identify, _dist_train, _train_entries, plain_round


_pinned_pair = pinned_pair


RC2 = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-3}


def _ctx(nodes, i, run_id, secagg):
    return Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                   run_config={**RC2, "secagg": secagg})


def _broadcast(seed=5):
    from flower_vfl.io.data import party_block
    n = party_block("breast_cancer", 0, 2)[0].shape[0]
    rng = np.random.default_rng(seed)
    return rng.normal(size=n) * 0.1, rng.normal(size=n) * 1e-3


# ------------------------------------------------------------------ a plain release racing a secure sum
def test_a_plain_release_racing_a_secure_sum_is_refused_before_its_charge(tmp_path, monkeypatch):
    """A pinned party's plain release is a sum over itself alone (claim_plain), and a secure sum claims
    another roster; whichever claims first wins. Before, a plain request was checked (check_plain), then
    computed (a private party: its round drawn and charged in its ledger), then claimed: a second run the
    central node started beside the first (run B, continuing run A's plan with the token A's identify gave,
    under secure aggregation) that claimed the roster between the check and the claim made run A's plain
    request refused AFTER its round was charged: a release charged that never left (and, the roster now
    secure, run A's plan could never continue in the clear). Here run B's masked request arrives while run
    A's round 1 is computed (another process answering meanwhile). Now the plain roster is claimed before
    anything is computed: run A's release goes out, run B is refused by name before any draw, and the ledger
    holds the one round-1 release, the one that left."""
    from flower_vfl.privacy.party import PrivateParty
    nodes = _pinned_pair(tmp_path)
    q, y = _broadcast()
    a0 = _ctx(nodes, 0, 1, False)
    token = _dist_identify(a0)["plan"]
    B = [_ctx(nodes, 0, 2, True), _ctx(nodes, 1, 2, True)]
    assert _dist_identify(B[0], token)["continued"] is True
    ads = sa_adverts(B)
    real, raced = PrivateParty.train_release, []

    def racing(self, *a, **kw):
        out = real(self, *a, **kw)
        if not raced:                        # run A's round 1, just computed: run B's request meanwhile
            raced.append(None)
            raced[0] = _dist_train(B[0], ads, q, y, 1)
        return out
    monkeypatch.setattr(PrivateParty, "train_release", racing)
    rep = plain_round(a0, q, y, 1, theta=0.5)
    assert "release" in rep, dict(rep["refusal"])
    assert raced[0]["refusal"]["code"] == "secagg-roster"
    assert str(raced[0]["refusal"]["reason"]).startswith(
        "party 'party0' released in the clear before (a plain release is a sum over this party alone, recorded in "
        "its state folder); refused in a secure sum over [party0,party1]")
    assert [e[1:] for e in _train_entries(nodes[0])] == [(1, "train", "gaussian")]


def test_a_secure_sum_that_claimed_first_refuses_the_plain_request_before_any_charge(tmp_path):
    """The other order of the race: run B's masked round 1 claimed the roster [party0,party1] (and drew
    round 1 of the plan); run A's plain request of round 2 on the same plan is refused before its x-update,
    naming the roster, and the ledger keeps only B's round 1 (nothing charged for the refusal)."""
    nodes = _pinned_pair(tmp_path)
    q, y = _broadcast()
    a0 = _ctx(nodes, 0, 1, False)
    token = _dist_identify(a0)["plan"]
    B = [_ctx(nodes, 0, 2, True), _ctx(nodes, 1, 2, True)]
    assert _dist_identify(B[0], token)["continued"] is True
    ads = sa_adverts(B)
    assert "release" in _dist_train(B[0], ads, q, y, 1)
    rep = plain_round(a0, q, y, 2, theta=0.5)
    assert rep["refusal"]["code"] == "secagg-roster"
    assert str(rep["refusal"]["reason"]).startswith(
        "party 'party0' answers secure sums over one roster only, [party0,party1] (recorded in its state folder at "
        "its first masked answer); a plain release is a sum over this party alone")
    assert [e[1:] for e in _train_entries(nodes[0])] == [(1, "train", "gaussian")]


# ------------------------------------------------------------------ the exact x-update at server-chosen extremes
def _reference_x(D, v, lam, rho_x, b1):
    """argmin lam/2 ||x||^2 + rho_x/2 ||D x - v||^2 over ||x|| <= b1, from D's SVD and the ball's secular
    equation solved by bisection on mu >= 0 (an independent closed form, float64)."""
    U, s, Vt = np.linalg.svd(D, full_matrices=False)
    b = U.T @ v

    def x_of(mu):
        return Vt.T @ (rho_x * s * b / (lam + mu + rho_x * s * s))
    x = x_of(0.0)
    if np.linalg.norm(x) <= b1:
        return x
    lo, hi = 0.0, 1.0
    while np.linalg.norm(x_of(hi)) > b1:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.linalg.norm(x_of(mid)) > b1 else (lo, mid)
    return x_of(hi)


@pytest.mark.parametrize("shape", ["duplicated-columns", "wider-than-rows", "one-row"])
@pytest.mark.parametrize("rho,theta", [(1e-6, 1.0), (1.0, 1e-12), (1.0, 1e-150)])
def test_the_exact_x_update_keeps_neighbouring_releases_within_the_strict_bound(shape, rho, theta):
    """The central node picks rho and theta (rho_x = rho / theta: theta in (0, 1], so rho_x is unbounded
    above) and, on own data, the rows and their order; the party's block may be rank-deficient (duplicated
    columns) or wider than the rows aligned. The strict bound (docs/privacy.md) holds for the exact
    minimizer of the ball-constrained x-update; the private party's x-update is always the gram solve
    (eigen + secular equation). Against an independent closed form (SVD + bisection), at lam = 1e-6
    (rho_x / lam up to 1e156), for neighbouring blocks (one unit row replaced by its negation, the worst
    for that row) and the adversarial target v = c_v sign(D_0 ...), the party's x is the minimizer (to
    1e-9 relative in the release) and ||clip(D x) - clip(D' x')|| stays below the C it calibrates with."""
    from flower_vfl.core.scoring import normalize_rows
    from flower_vfl.privacy.party import PrivacyConfig, PrivateParty
    rng = np.random.default_rng(3)
    N, d = {"duplicated-columns": (40, 6), "wider-than-rows": (5, 30), "one-row": (1, 4)}[shape]
    base = rng.normal(size=(N, 1 if shape == "duplicated-columns" else d))
    D = normalize_rows(np.repeat(base, d, axis=1) if shape == "duplicated-columns" else base)
    D2 = D.copy()
    D2[0] = -D[0]
    cfg = PrivacyConfig(epsilon=1.0, train_rounds=1, eval_rounds=1, lam=1e-6)
    v = cfg.c_v * np.sign(D @ np.ones(d) + 1e-3)
    out = []
    for M in (D, D2):
        p = PrivateParty(M, None, 1.0, cfg)
        s = p.update.step(None, None, rho, 1.0, theta, v=v.copy(), q_norm=1.0)
        ref = M @ _reference_x(M, v, cfg.lam, rho / theta, cfg.b1)
        assert np.linalg.norm(s - ref) <= 1e-9 * max(1.0, np.linalg.norm(ref))
        out.append(np.clip(s, -cfg.c_s, cfg.c_s))
    C = p.sensitivity(rho, theta, "train")
    assert np.linalg.norm(out[0] - out[1]) <= C


def test_a_theta_that_overflows_the_bound_is_refused_before_any_work_or_charge():
    """theta = 1e-300 at rho = 1e3: rho_x = 1e303, where the bound overflows (and the gram solve no longer
    finds the minimizer: it returns x = 0). The party refuses before its x-update, nothing charged."""
    from flower_vfl.privacy.boundary import InvalidMessage
    from flower_vfl.privacy.party import PrivacyConfig, PrivateParty
    rng = np.random.default_rng(4)
    D = rng.normal(size=(20, 3))
    p = PrivateParty(D, None, 1.0, PrivacyConfig(epsilon=1.0, train_rounds=1, eval_rounds=1, lam=1e-6))
    with pytest.raises(InvalidMessage) as exc:
        p.train_release(1, rng.normal(size=20), np.zeros(20), 1e3, 1.0, 1e-300)
    assert str(exc.value).startswith("party 0: the train release at rho=1000.0 would have a non-finite sensitivity; "
                                     "refused, nothing charged")
    assert p.ledger.entries == [] and not np.any(p.update.x)


# ------------------------------------------------------------------ a plan that lapses between identify and release
def test_a_plan_lapsed_between_identify_and_first_release_spends_nothing_and_cannot_overbook(tmp_path, monkeypatch):
    """The central node identifies run A (its plan reserves the party's whole budget), waits past the
    party's dp-plan-expiry (its node config: 100 s here; the clock is the store's), starts run C (A's plan
    lapses, C's plan takes the budget), then sends run A's round 1 and resumes A's plan from a new run D
    with A's token. Run A's release is refused before any x-update or charge (C's reservation), run D's
    resume is refused by name at identify (the lapsed plan's 3 unmade releases no longer fit), and C's
    releases go out: the ledger never holds more than one plan's releases and reservations, ε <= 1."""
    from types import SimpleNamespace
    from flower_vfl.privacy import store as store_mod
    from flower_vfl.privacy.accounting import epsilon_for_events
    from flower_vfl.privacy.store import party_store
    clock = [1000.0]
    import time as real_time
    monkeypatch.setattr(store_mod, "time", SimpleNamespace(time=lambda: clock[0], monotonic=real_time.monotonic,
                                                           sleep=real_time.sleep))
    node = {"partition-id": 0, "state-dir": str(tmp_path / "s0"), "dp": True, "dp-epsilon": 1.0,
            "dp-train-rounds": 2, "dp-eval-rounds": 1, "dp-plan-expiry": 100.0}

    def ctx(run_id):
        return Context(run_id=run_id, node_id=100, node_config=dict(node), state=RecordDict(),
                       run_config={**RC2, "secagg": False})
    q, y = _broadcast()
    A = ctx(1)
    token = _dist_identify(A)["plan"]
    clock[0] += 150.0                            # past the party's expiry: A made no release nor resume
    C = ctx(3)
    assert _dist_identify(C)["affordable"] is True
    rep = plain_round(A, q, y, 1, theta=0.5)
    # refused when run A's message arrives, before its x-update: its lapsed plan's releases no longer fit
    # (test_attacks_review5.py: a lapsed plan's own run goes on only if its unmade releases fit again)
    assert str(rep["refusal"]["reason"]) == (
        "party 0 refuses run 1: its budget is reserved by run 3 (0 of 3 planned releases made). With that "
        "reservation ε=1 of its budget ε=1 is taken (δ=1e-05, method='exact'; spent ε=0), and the lapsed plan of "
        "run 1 it resumes (0 of 3 planned releases made, 3 left; its reservation was given up when it lapsed) would "
        "bring it to ε=1.465. Wait for that run to end, or resume it (resume='<its state-dir>'); a reservation whose "
        "run made no release (nor a first resume since) for dp-plan-expiry=100 s (the party's node config) lapses")
    assert _train_entries(node) == []
    D = ctx(4)
    ident = _dist_identify(D, token)
    assert ident["affordable"] is False
    assert str(ident["refused"]) == (
        "party 0 refuses run 4: its budget is reserved by run 3 (0 of 3 planned releases made). With that "
        "reservation ε=1 of its budget ε=1 is taken (δ=1e-05, method='exact'; spent ε=0), and the lapsed plan of "
        "run 1 it resumes (0 of 3 planned releases made, 3 left; its reservation was given up when it lapsed) would "
        "bring it to ε=1.465. Wait for that run to end, or resume it (resume='<its state-dir>'); a reservation whose "
        "run made no release (nor a first resume since) for dp-plan-expiry=100 s (the party's node config) lapses")
    for rnd in (1, 2):
        assert "release" in plain_round(C, q, y, rnd, theta=0.5)
    st = party_store(node["state-dir"])
    (src, _), = st.sources()
    entries = st.entries(src)
    assert [(e.run, e.round) for e in entries] == [("3", 1), ("3", 2)]
    plans = {p.plan: p.status for p in st.plans(src)}
    assert plans == {"1": "lapsed", "3": "open"}
    reserved = st.reserved_events(src)
    total = epsilon_for_events([(e.mechanism, e.noise_multiplier) for e in entries] + reserved, 1e-5, "exact")
    assert len(reserved) == 1 and total <= 1.0 * (1 + 1e-9)
