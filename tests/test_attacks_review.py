"""An adversarial review of the party side: a malicious central node against the real ClientApp
handlers (``flower_vfl.apps.client``), a fresh Flower ``Context`` per run, the party's own state-dir.

Each test is an attack the earlier attack tests (test_trust_boundary.py, test_budget_identity.py,
test_secagg_roster.py, test_failure_budget.py, ...) did not make, with what the party must do:
refuse by name before anything is charged, or release exactly what its calibration covers.
"""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.io import psi
from flower_vfl.io.bundled import write_table
from flower_vfl.privacy.store import PartyStore

from _party_handlers import fresh_context, send_message, RC, _task_identity  # noqa: F401  (_task_identity: autouse)


ctx, send = fresh_context, send_message     # a fresh Context per run; a message to a handler


def identify(context):
    return send(ca.identify, context, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify")


def refusal(reply):
    assert "refusal" in reply.content, f"expected a refusal, got {list(reply.content.keys())}"
    return dict(reply.content["refusal"])


def target_round(rnd, v, rho, q_norm, theta=1.0):
    """A train request carrying the x-update target alone (alpha = 1) and the server's ||q||."""
    return RecordDict({"config": ConfigRecord({"round": rnd, "rho": rho, "alpha": 1.0, "theta": theta,
                                               "q_norm": q_norm}),
                       "vectors": ArrayRecord({"v": Array(np.asarray(v, dtype=float))})})


def entries(state_dir):
    store = PartyStore(state_dir)
    return [e for src, _ in store.sources() for e in store.entries(src)]


def ball_ridge(F, v, rho, lam, b1):
    """Reference: argmin_{||x|| <= b1} lam/2 ||x||^2 + rho/2 ||F x - v||^2 by the eigendecomposition of
    F^T F and bisection on the ball's multiplier (numpy only, none of the party's solvers)."""
    e, V = np.linalg.eigh(F.T @ F)
    c = V.T @ (rho * (F.T @ v))
    x_of = lambda mu: V @ (c / (rho * e + lam + mu))          # noqa: E731
    if np.linalg.norm(x_of(0.0)) <= b1:
        return x_of(0.0)
    lo, hi = 0.0, 1.0
    while np.linalg.norm(x_of(hi)) > b1:
        hi *= 2.0
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.linalg.norm(x_of(mid)) > b1 else (lo, mid)
    return x_of(hi)


# ------------------------------------------------------------------ the x-update's exactness
@pytest.fixture
def own_file(tmp_path):
    rng = np.random.default_rng(5)
    n = 300
    ids = [f"p{i:04d}" for i in range(n)]
    path = write_table(tmp_path / "bank.csv", ids, rng.normal(size=(n, 6)), [f"f{j}" for j in range(6)], "csv")
    return path, ids


def test_a_server_chosen_subset_and_q_norm_cannot_make_the_private_x_update_inexact(tmp_path, own_file):
    """The strict bound (docs/privacy.md) holds for the exact minimizer of the x-update. The server picks
    a PSI subset of 30 rows and the run config's party-model 'bins' (the party's block: 48 sparse
    columns, wider than its rows), where 'auto' chose FISTA warm-started from the party's last x and
    stopped at a tolerance the server's q_norm sets: with q_norm = 1e300 the party's x was 0.14 from
    the minimizer (its norm is 2) after round 1, an output no sensitivity bound covers. The private party now solves
    exactly (eigendecomposition and the ball's secular equation) whatever the server sends."""
    path, ids = own_file
    lam, b1, c_v, rho = 1e-2, 2.0, 1.0, 1.0
    nc = {"partition-id": 1, "dp": True, "dp-epsilon": 4.0, "dp-train-rounds": 2, "dp-eval-rounds": 0,
          "dp-lam": lam, "dp-b1": b1, "dp-clip": c_v, "data-path": str(path), "state-dir": str(tmp_path / "p1")}
    c = ctx(nc, 1, {"num-parties": 2, "lam": 1e-2, "party-model": "bins"})
    order = ids[:30]
    send(ca.psi_party.psi_order, c, RecordDict({"psi": ConfigRecord({
        "split": "train", "order": psi.encode_ids(order), "digest": psi.ids_digest(order)})}), "query.psi_order")
    # the party's own block as it maps it (the map is not what is under test), rows unit norm
    from flower_vfl.core.blocks import block_from_config
    from flower_vfl.core.scoring import normalize_rows
    D = ca.psi_party.own_blocks(c)[0]
    F = normalize_rows(block_from_config({"party-model": "bins"}, private=True).fit_features(D))
    F = F.toarray() if hasattr(F, "toarray") else np.asarray(F)
    assert F.shape == (30, 48)
    rng = np.random.default_rng(1)
    for rnd in (1, 2):
        v = rng.normal(size=30) * 3.0
        rep = send(ca.train, c, target_round(rnd, v, rho, q_norm=1e300), "train")
        assert "release" in rep.content
        (plan,) = {e.run for e in entries(nc["state-dir"])}
        store = PartyStore(nc["state-dir"])
        (src, _), = store.sources()
        x = store.get_state(src, plan)["x"]
        want = ball_ridge(F, np.clip(v, -c_v, c_v), rho, lam, b1)
        assert np.linalg.norm(want) > 0.5
        assert np.linalg.norm(x - want) <= 1e-8 * max(1.0, np.linalg.norm(want))
    assert len(entries(nc["state-dir"])) == 2


def test_a_private_block_too_wide_for_the_exact_x_update_is_refused_before_any_release(tmp_path):
    """The run config's party-model 'rff' on a node whose settings give 4000 random features: 4015
    dense columns, more than the exact solver's 4000 (the server could also pick a small num-parties of
    a wide dataset). Refused at identify and at a train request, by name, nothing charged or reserved."""
    nc = {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "dp-train-rounds": 1, "dp-eval-rounds": 1,
          "party-model-features": 4000, "state-dir": str(tmp_path / "p1")}
    rc = {**RC, "party-model": "rff"}
    why = ("party 1 is private and its block has 4015 columns (after its party-model map), more than 4000: its "
           "x-update would be iterative, stopped by a tolerance the central node's messages set (q, q_norm, "
           "theta), not the exact minimizer its sensitivity bound is derived for (docs/privacy.md); refused "
           "before any release. Give it at most 4000 columns (fewer party-model features or knots, more "
           "num-parties), or run it without dp")
    from flower_vfl.privacy.party import BlockTooWide
    with pytest.raises(BlockTooWide) as exc:
        identify(ctx(nc, 1, rc))
    assert str(exc.value) == why
    n = ca._party_setup(ctx(nc, 2, rc))[5].shape[0]
    rep = refusal(send(ca.train, ctx(nc, 2, rc), target_round(1, np.zeros(n), 1.0 / n, 0.0), "train"))
    assert rep == {"party": 1, "reason": why, "code": "block", "field": "block"}
    assert entries(nc["state-dir"]) == []
    assert PartyStore(nc["state-dir"]).sources() == []


# ------------------------------------------------------------------ secure aggregation: one history per sum
SA_M = 3
SA_ALL = ["party0", "party1", "party2"]
SA_N = None
SA_RC = {"dataset": "breast_cancer", "num-parties": SA_M, "secagg": True, "lam": 1e-3}


def sa_nodes(tmp_path):
    """Three non-private parties, each with its own state-dir and its key pinned by the others (the
    strongest setting: every pinned party is required in every sum)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from flower_vfl.secagg import public_key_hex, signing_key_pem
    keys = [Ed25519PrivateKey.generate() for _ in range(SA_M)]
    out = {}
    for i, k in enumerate(keys):
        (tmp_path / f"party{i}.pem").write_bytes(signing_key_pem(k))
        out[i] = {"partition-id": i, "state-dir": str(tmp_path / f"p{i}"),
                  "secagg-signing-key": str(tmp_path / f"party{i}.pem"),
                  "secagg-pins": ", ".join(f"party{j}={public_key_hex(keys[j])}" for j in range(SA_M) if j != i)}
    return out


def sa_ctxs(nodes, run_id):
    return [Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                    run_config=dict(SA_RC)) for i in sorted(nodes)]


def sa_adverts(ctxs):
    return [ca.secagg_keys(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=c.node_id,
                                   message_type="query.secagg_keys"), c).content["secagg"]["advert"] for c in ctxs]


def sa_train(c, ads, q, y, rnd):
    from flower_vfl.secagg.masking import ADVERTS, PARTIES
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(np.asarray(q, float)), "y": Array(np.asarray(y, float))}),
                     "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / SA_M,
                                             ADVERTS: list(ads), PARTIES: list(SA_ALL)})})
    rep = ca.train(Message(rd, dst_node_id=c.node_id, message_type="train"), c).content
    assert "release" in rep, dict(rep["refusal"]) if "refusal" in rep else list(rep.keys())
    return rep["release"]["s"].numpy()


def sa_decode(masked, ads):
    from flower_vfl.secagg import Advert, Roster, secure_sum
    return secure_sum(masked, Roster([Advert.from_bytes(a) for a in ads]))


def sa_inputs(n):
    rng = np.random.default_rng(7)
    return rng.normal(size=n) * 0.1, rng.normal(size=n) * 1e-3


def sa_plain_release(tmp_path, rounds):
    """Party 2's plain releases for the broadcasts ``rounds`` (secagg off, its own fresh state-dir)."""
    c = Context(run_id=900, node_id=102, node_config={"partition-id": 2, "state-dir": str(tmp_path / "plain")},
                state=RecordDict(), run_config={**SA_RC, "secagg": False})
    out = []
    for rnd, (q, y) in enumerate(rounds, start=1):
        rd = RecordDict({"vectors": ArrayRecord({"q": Array(q), "y": Array(y)}),
                         "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / SA_M})})
        out.append(ca.train(Message(rd, dst_node_id=102, message_type="train"), c).content["release"]["s"].numpy())
    return out


def test_a_party_fed_another_broadcast_once_is_not_isolated_by_a_second_run(tmp_path):
    """Run A: round 1 (q, y) to every party, round 2 (0, 0): the sum a0 + a1 + a2. Run B, the same
    three parties (the one roster): round 1 sends party 2 alone (0, 0) -- that sum is garbage, but party
    2's state is now the zero state -- and round 2 sends (0, 0) to all. Parties 0 and 1 answer round 2
    exactly as in run A and party 2 answers 0, so A - B was party 2's exact release a2 (measured here:
    to the fixed-point bound). Each party now masks against the history of broadcasts its state comes
    from, so run B's round 2 does not decode (SumMismatch): no sum over parties of two histories."""
    from flower_vfl.secagg import SumMismatch
    nodes = sa_nodes(tmp_path)
    n = ca._party_setup(sa_ctxs(nodes, 1)[0])[5].shape[0]
    q, y = sa_inputs(n)
    zero = np.zeros(n)
    A = sa_ctxs(nodes, 1)
    ads = sa_adverts(A)
    first = sa_decode({name: sa_train(c, ads, q, y, 1) for name, c in zip(SA_ALL, A)}, ads)
    honest = sa_decode({name: sa_train(c, ads, zero, zero, 2) for name, c in zip(SA_ALL, A)}, ads)
    a2 = sa_plain_release(tmp_path, [(q, y), (zero, zero)])[1]
    assert np.max(np.abs(a2)) > 1e-3 and np.all(np.isfinite(first)) and np.all(np.isfinite(honest))
    B = sa_ctxs(nodes, 2)
    ads = sa_adverts(B)
    for name, c in zip(SA_ALL, B):
        sa_train(c, ads, *((zero, zero) if name == "party2" else (q, y)), 1)
    masked = {name: sa_train(c, ads, zero, zero, 2) for name, c in zip(SA_ALL, B)}
    with pytest.raises(SumMismatch):
        sa_decode(masked, ads)


def test_a_resume_mixing_two_runs_states_is_not_a_sum(tmp_path):
    """The resume tokens (docs/secagg.md, "Resume"): run A gives each party a token and sums round 1
    (q, y); run C sums round 1 (0, 0) over the same parties (party 2's state there: zero). Run B resumes
    parties 0 and 1 from run A's token and party 2 from run C's, then sums round 2 (0, 0): before, that
    was a0 + a1 + 0 against run A's a0 + a1 + a2 for the same round 2 -- party 2's exact release, from
    "a central node that presents an old token" (which the docs said learns nothing new). Now each
    restored state keeps its history and run B's round 2 does not decode."""
    import json
    from flower_vfl.secagg import SumMismatch
    from flower_vfl.clients.party_secagg import RESUME_ROUND
    nodes = sa_nodes(tmp_path)
    n = ca._party_setup(sa_ctxs(nodes, 1)[0])[5].shape[0]
    q, y = sa_inputs(n)
    zero = np.zeros(n)

    def run(run_id, rounds, plans=None):
        ctxs = sa_ctxs(nodes, run_id)
        tokens = []
        for i, c in enumerate(ctxs):
            cfg = {"want": "party"} if plans is None else {"plans": json.dumps({str(i): plans[i]}), RESUME_ROUND: 1}
            tokens.append(str(identify(c).content["identity"]["plan"]) if plans is None else str(
                send(ca.identify, c, RecordDict({"config": ConfigRecord(cfg)}), "query.identify")
                .content["identity"]["plan"]))
        ads = sa_adverts(ctxs)
        sums = [sa_decode({name: sa_train(c, ads, qq, yy, rnd) for name, c in zip(SA_ALL, ctxs)}, ads)
                if rnd == 1 or plans is None else {name: sa_train(c, ads, qq, yy, rnd) for name, c in zip(SA_ALL, ctxs)}
                for rnd, (qq, yy) in rounds]
        return tokens, sums, ads

    tok_a, _, _ = run(1, [(1, (q, y))])
    tok_c, _, _ = run(3, [(1, (zero, zero))])
    restored, (masked,), ads = run(2, [(2, (zero, zero))], plans=[tok_a[0], tok_a[1], tok_c[2]])
    assert restored == [tok_a[0], tok_a[1], tok_c[2]]            # each party restored the state its token names
    with pytest.raises(SumMismatch):
        sa_decode(masked, ads)


def test_own_data_secagg_models_predict_their_sum_and_a_model_re_saved_from_another_run_gives_none(tmp_path):
    """Own data (a9a, 800 training rows, 300 to score), trained under secure aggregation: the parties'
    histories start from the agreed training order and every party saves its model with it, so the
    masked predict job decodes the plain predict's scores (to the fixed-point bound). Then run C (another
    lam) trains again and only party 2 writes its model where the predict job reads it: a predict sum
    over run A's models of parties 0, 1 and run C's of party 2, differenced with the first, would be
    party 2's exact scores. Its history differs, so the sum does not decode (SumMismatch)."""
    from _own_data_helpers import HANDLERS, node_configs, run_config, write_a9a_files
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.io.data import load_all
    from flower_vfl.secagg import FixedPoint, SumMismatch
    from flower_vfl.strategies import own_data
    X, y, Xt, _ = load_all("a9a")
    train_files, score_files = write_a9a_files(tmp_path, X[:800], y[:800], Xt[:300])
    nodes = node_configs(train_files, score_files, "csv", tmp_path)
    for m in range(3):
        nodes[100 + m]["state-dir"] = str(tmp_path / f"state{m}")
    rc = run_config(train_files, score_files, tmp_path, secagg=True, **{"max-rounds": 8})
    handlers = {**HANDLERS, "query.secagg_keys": ca.secagg_keys}

    runs = iter(range(1, 100))             # every job its own Flower run (fresh Contexts, its own run id)

    def run_train(cfg, node_cfgs):
        return own_data.train(LocalGrid(handlers, node_cfgs, cfg, run_id=next(runs)), cfg, sa.make_strategy)

    run_train(rc, nodes)

    def predict(secagg):
        cfg = dict(rc, mode="predict", secagg=secagg)
        return own_data.predict(LocalGrid(handlers, nodes, cfg, run_id=next(runs)), cfg)

    plain, masked = predict(False), predict(True)
    assert masked["ids"] == plain["ids"] and len(plain["ids"]) > 250
    slack = 4 * np.finfo(float).eps * max(float(np.max(np.abs(plain["scores"]))), 1.0)
    assert np.max(np.abs(masked["scores"] - plain["scores"])) <= FixedPoint([1e4] * 3).error_bound + slack
    other = {k: dict(v) for k, v in nodes.items()}
    for m in (0, 1):                      # run C's models of parties 0 and 1 go elsewhere
        other[100 + m]["model-dir"] = str(tmp_path / f"run-c-models-party{m}")
    run_train(dict(rc, lam=3e-2, **{"model-dir": str(tmp_path / "owner-c")}), other)
    with pytest.raises(SumMismatch):
        predict(True)


# ------------------------------------------------------------------ one person aligned
def test_a_psi_order_of_one_person_gets_a_release_calibrated_for_that_person(tmp_path, own_file):
    """The server aligns a single ID (N = 1): nothing in the strict bound needs many rows -- the changed
    row's own term 2 min(b1, c_s) is there for any N -- so the party answers, at sigma = z C with
    C = 2 sqrt(rho_x (b1 + c_v)^2 / lam + min(b1, c_s)^2) (closed form here), and its default rho range
    is its own N's: rho up to 1e3 / N = 1000 accepted, anything above refused before any charge."""
    from flower_vfl.privacy import noise_multiplier_for
    path, ids = own_file
    lam, b1, c, rho, theta = 0.5, 2.0, 1.0, 1e3, 0.5
    nc = {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "dp-train-rounds": 2, "dp-eval-rounds": 0,
          "dp-lam": lam, "dp-b1": b1, "dp-clip": c, "data-path": str(path), "state-dir": str(tmp_path / "p1")}
    cx = ctx(nc, 1, {"num-parties": 2, "lam": 1e-2})
    send(ca.psi_party.psi_order, cx, RecordDict({"psi": ConfigRecord({
        "split": "train", "order": psi.encode_ids(ids[7:8]), "digest": psi.ids_digest(ids[7:8])})}), "query.psi_order")
    over = refusal(send(ca.train, cx, target_round(1, [5.0], 1000.5, 0.0, theta), "train"))
    assert over == {"party": 1, "code": "invalid", "field": "config.rho", "reason": (
        "party 1: config['rho']=1000.5 is outside the range this party accepts [0.001, 1000] (its node config's "
        "min-rho / max-rho where set, else a private party's default 0.001/N .. 1000/N for its N=1 rows: a rho "
        "far from the loss's scale 1/N buys no accuracy for the budget it spends; set min-rho / max-rho in its "
        "node config to accept another); refused, nothing charged")}
    assert entries(nc["state-dir"]) == []
    rep = send(ca.train, cx, target_round(1, [5.0], rho, 0.0, theta), "train")
    assert rep.content["release"]["s"].numpy().shape == (1,)
    (e,) = entries(nc["state-dir"])
    C = 2.0 * np.sqrt((rho / theta) * (b1 + c) ** 2 / lam + min(b1, c) ** 2)
    assert e.sensitivity == pytest.approx(C, rel=1e-12)
    assert e.sigma == pytest.approx(noise_multiplier_for(1.0, 1e-5, 2) * C, rel=1e-12)

