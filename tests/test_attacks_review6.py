"""A sixth adversarial review of the party side: a malicious central node against the real ClientApp
handlers (``flower_vfl.apps.client``), a fresh Flower ``Context`` per run, the party's own state-dir.
Each test is an attack the earlier reviews (test_attacks_review.py .. test_attacks_review5.py) did not
make, with what the party must do: refuse by name before anything is charged, or release exactly what
its calibration covers.

The hole found here: every private release's sensitivity (the ADMM x-update's, the SSP release's, the
label moment's) is derived for one row of the party's block D replaced, every other row unchanged. A
party on its own files with the node config's ``preprocess='standardize'`` or ``'maxabs'`` scales each
column by statistics fitted on its aligned training rows -- a subset the server picks by PSI -- so one
person present or replaced changes every row of D. A private party now refuses such a preprocessing
before any release (``flower_vfl.clients.psi_party.refuse_fitted_preprocessing``).
"""
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from _party_handlers import fresh_context, send_message, _task_identity  # noqa: F401  (autouse)
from flower_vfl.apps import client as ca
from flower_vfl.config.schema import ConfigError
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.io import Preprocessor, psi
from flower_vfl.io.bundled import write_table
from flower_vfl.privacy import noise_multiplier_for
from flower_vfl.privacy.label_moments import moment_sensitivity
from flower_vfl.privacy.ssp import ssp_sensitivity
from flower_vfl.privacy.store import PartyStore

N, D_COLS, C_V, EPS = 200, 5, 1.0, 1.0


ctx, send = fresh_context, send_message     # a fresh Context per run; a message to a handler


def entries(state_dir):
    store = PartyStore(state_dir)
    return [e for src, _ in store.sources() for e in store.entries(src)]


def align(cx, split, ids):
    send(ca.psi_party.psi_order, cx, RecordDict({"psi": ConfigRecord({
        "split": split, "order": psi.encode_ids(ids), "digest": psi.ids_digest(ids)})}), "query.psi_order")


def release_rd(v, rnd=1):
    return RecordDict({"vectors": ArrayRecord({"v": Array(np.asarray(v, dtype=float))}),
                       "config": ConfigRecord({"round": rnd})})


@pytest.fixture
def files(tmp_path):
    """The party's training and held-out files. Column f0 is 1e-3 for everyone but p0000, who has 1.0:
    under 'maxabs' p0000 alone sets that column's scale for every row."""
    rng = np.random.default_rng(11)
    ids = [f"p{i:04d}" for i in range(N)]
    X = 0.1 * rng.normal(size=(N, D_COLS))
    X[:, 0] = 1e-3
    X[0, 0] = 1.0
    cols = [f"f{j}" for j in range(D_COLS)]
    tr = write_table(tmp_path / "train.csv", ids, X, cols, "csv")
    tids = [f"t{i:04d}" for i in range(40)]
    te = write_table(tmp_path / "test.csv", tids, 0.1 * rng.normal(size=(40, D_COLS)), cols, "csv")
    return tr, te, ids, tids, X, cols


def node(tmp_path, files, preprocess, **kw):
    tr, te, *_ = files
    return {"partition-id": 1, "dp": True, "dp-epsilon": EPS, "dp-clip": C_V, "data-path": str(tr),
            "test-path": str(te), "moment-pool": "test", "preprocess": preprocess,
            "state-dir": str(tmp_path / "p1"), **kw}


def refusal_text(party, kind):
    return (f"party {party} is private and its node config's preprocess={kind!r} scales each column by statistics "
            "fitted on its aligned training rows, so one person changes every row and no release would be within "
            "its calibrated sensitivity; refused before any release. Set preprocess='none' in its node config "
            "(rows are scaled to unit norm anyway), or scale the file's columns by fixed constants that are not "
            "computed from its rows")


def test_fitted_preprocessing_moves_one_persons_release_far_past_its_calibrated_sensitivity(files):
    """Why the refusal: the label moment D^T v (the statistic both one-release routes and the ADMM target's
    D^T term carry) on two neighbouring sources, p0000's row replaced (its f0 = 1.0 -> 1e-3), v = c_v
    everywhere. Row-local rows ('none': each row scaled to unit norm) move by at most 2 c_v (the
    calibrated sensitivity); 'maxabs' moves f0 of every other row (scale 1.0 -> 1e-3) and 'standardize' every
    row's centring, each far past it -- so the Gaussian noise calibrated to 2 c_v covers nobody."""
    *_, X, cols = files
    X2 = X.copy()
    X2[0, 0] = 1e-3
    v = np.full(N, C_V)
    shift = {}
    for kind in ("none", "maxabs", "standardize"):
        D = normalize_rows(Preprocessor(kind).fit_transform(X, cols))
        D2 = normalize_rows(Preprocessor(kind).fit_transform(X2, cols))
        shift[kind] = (np.linalg.norm(D.T @ v - D2.T @ v), int(np.sum(np.any(D != D2, axis=1))))
    assert shift["none"][1] == 1 and shift["none"][0] <= moment_sensitivity(C_V)
    assert shift["maxabs"][1] >= N - 1 and shift["maxabs"][0] > 10 * moment_sensitivity(C_V)
    assert shift["standardize"][1] >= N - 1 and shift["standardize"][0] > 2 * moment_sensitivity(C_V)


@pytest.mark.parametrize("kind", ["maxabs", "standardize"])
def test_a_private_party_with_fitted_preprocessing_refuses_every_route_before_any_release(tmp_path, files, kind):
    """The server aligns a training subset (PSI) and asks each route's release of a private party whose node
    config says preprocess=<kind>: the ADMM identify and round, the moment release and the SSP release are
    refused naming the node-config key and the fix, and nothing is charged on the party's disk."""
    _, _, ids, tids, *_ = files
    nc = node(tmp_path, files, kind)
    sub = ids[:150]
    for run, (handler, rd, mtype, rc) in enumerate([
            (ca.identify, RecordDict({"config": ConfigRecord({"want": "party"})}), "query.identify",
             {"num-parties": 2}),
            (ca.train, RecordDict({"config": ConfigRecord({"round": 1, "rho": 1.0 / len(sub), "alpha": 1.0}),
                                   "vectors": ArrayRecord({"v": Array(np.zeros(len(sub)))})}), "train",
             {"num-parties": 2}),
            (ca.moment_release, release_rd(np.full(len(sub), C_V)), "query.moment_release",
             {"num-parties": 2, "route": "moment"}),
            (ca.ssp_release, release_rd(np.full(len(sub), C_V)), "query.ssp_release",
             {"num-parties": 2, "route": "stacked-ssp"})], start=1):
        cx = ctx(nc, run, rc)
        align(cx, "train", sub)
        align(cx, "test", tids)
        with pytest.raises(ConfigError) as err:
            send(handler, cx, rd, mtype)
        assert str(err.value) == refusal_text(1, kind), mtype
    assert entries(nc["state-dir"]) == []


def test_with_row_local_rows_both_one_release_routes_charge_their_closed_form_sensitivity(tmp_path, files):
    """The bound that holds: preprocess='none' (the default), a server-chosen subset of 150 rows and a
    target 50 times the party's clip. The moment release is charged at C = 2 c_v, the SSP release at
    C = sqrt(2 + 4 c_v^2), each at sigma = z C with z the party's accountant's for one release at its
    (epsilon, delta); the released g~ minus D^T clip(v) is the noise, of norm ~ sigma sqrt(d) (a chi
    test: within [0.2, 3] sigma sqrt(d), far below the unclipped statistic's distance 49 ||D^T 1||)."""
    _, _, ids, tids, X, cols = files
    nc = node(tmp_path, files, "none")
    sub = ids[50:]
    v = np.full(len(sub), 50.0 * C_V)
    z = noise_multiplier_for(EPS, 1e-5, 1)
    cx = ctx(nc, 1, {"num-parties": 2, "route": "moment"})
    align(cx, "train", sub)
    align(cx, "test", tids)
    rep = send(ca.moment_release, cx, release_rd(v), "query.moment_release")
    assert "refusal" not in rep.content
    nc2 = node(tmp_path, files, "none", **{"state-dir": str(tmp_path / "p1-ssp")})   # a budget of its own
    cx = ctx(nc2, 2, {"num-parties": 2, "route": "stacked-ssp"})
    align(cx, "train", sub)
    align(cx, "test", tids)
    rep = send(ca.ssp_release, cx, release_rd(v), "query.ssp_release")
    assert "refusal" not in rep.content
    (mom,), (ssp,) = entries(nc["state-dir"]), entries(nc2["state-dir"])
    assert (mom.unit, ssp.unit) == ("moment:row", "ssp:row")
    assert mom.sensitivity == pytest.approx(2.0 * C_V, rel=1e-12)
    assert ssp.sensitivity == pytest.approx(ssp_sensitivity(C_V), rel=1e-12)
    for e in (mom, ssp):
        assert e.sigma == pytest.approx(z * e.sensitivity, rel=1e-9)
    D = normalize_rows(X[50:])                      # preprocess='none': the file's rows, unit norm
    store = PartyStore(nc["state-dir"])
    (src, _), = store.sources()
    noise = np.asarray(store.answer(src, "1/moment", 1, "eval").payload["g_tilde"]) - D.T @ np.full(len(sub), C_V)
    assert 0.2 * mom.sigma * np.sqrt(D_COLS) < np.linalg.norm(noise) < 3.0 * mom.sigma * np.sqrt(D_COLS)


# ------------------------------------------------------------------ the predict job
@pytest.mark.parametrize("private", [False, True])
def test_predict_on_server_chosen_rows_in_many_runs_gives_only_entries_of_one_score_vector(tmp_path, private):
    """The predict job (``query.predict``): the server aligns the party's scoring file to any order it likes
    -- one row ("one-hot" selections), a reversed subset, the same rows again -- in as many runs as it
    likes, a fresh Context each. Every answer is the chosen entries (to the ulp) of the one vector
    s = D_score x (a private party: normalize_rows(D_score) x~, post-processing of the released x~ its
    model file holds): no run yields a number that is not an entry of s, so K runs learn at most s's
    n_score values, whatever K; x itself needs D_score, which never leaves the party."""
    from flower_vfl.io import model_files as model_io
    rng = np.random.default_rng(3)
    n, cols = 30, [f"f{j}" for j in range(D_COLS)]
    sids = [f"s{i:03d}" for i in range(n)]
    Xs = rng.normal(size=(n, D_COLS))
    score = write_table(tmp_path / "score.csv", sids, Xs, cols, "csv")
    x = rng.normal(size=D_COLS)
    nc = {"partition-id": 1, "score-path": str(score), "model-dir": str(tmp_path / "model"),
          "state-dir": str(tmp_path / "p1"), "psi-max-asked": 50.0}
    if private:
        nc.update({"dp": True, "dp-epsilon": EPS})
    model_io.save_party_model(tmp_path / "model" / "party-1.npz", 1, x, cols, Preprocessor("none").fit(Xs, cols)
                              .to_dict(), "fp", 100, private=private)
    s = (normalize_rows(Xs) if private else Xs) @ x
    picks = [[i] for i in range(0, n, 7)] + [list(range(n))[::-1], list(range(5, 25)), list(range(5, 25))]
    seen = {}
    for run, pick in enumerate(picks, start=1):
        cx = ctx(nc, run, {"mode": "predict", "num-parties": 2})
        align(cx, "score", [sids[i] for i in pick])
        rep = send(ca.psi_party.predict, cx, RecordDict({"config": ConfigRecord({})}), "query.predict")
        got = rep.content["release"]["s_score"].numpy()
        np.testing.assert_allclose(got, s[pick], rtol=1e-12, atol=0)     # the file's CSV round trip: ulps
        for i, v in zip(pick, got):
            seen.setdefault(i, set()).add(float(v))
    assert set(seen) == set(range(n))
    # one value per row over all runs, up to the ulps of a one-row vs a many-row product (no new number)
    assert all(max(vs) - min(vs) <= 1e-12 * max(1.0, abs(s[i])) for i, vs in seen.items())
    assert entries(nc["state-dir"]) == []           # post-processing: nothing charged, in any run


def test_the_in_process_fit_refuses_fitted_preprocessing_for_a_private_party(tmp_path, capsys):
    """The same rule where one operator runs every party in process (``flower-vfl fit --party ... --dp``):
    --preprocess maxabs / standardize with a private party is refused before any round, naming the flags
    and the fix."""
    from flower_vfl.cli import commands as cli
    from flower_vfl.io.data import write_bundled
    write_bundled("breast_cancer", str(tmp_path / "demo"), 2)
    labels, party = tmp_path / "demo" / "train-party0.csv", tmp_path / "demo" / "train-party1.csv"
    for kind in ("maxabs", "standardize"):
        with pytest.raises(SystemExit) as e:
            cli.main(["fit", "--labels", str(labels), "--party", str(party), "--preprocess", kind,
                      "--dp", "--dp-epsilon", "1", "--dp-parties", "1", "--max-rounds", "2",
                      "--out-dir", str(tmp_path / "out")])
        assert e.value.code == 2
        assert capsys.readouterr().err == (
            f"flower-vfl: error: --preprocess={kind!r} with --dp: private party 1's columns would be "
            "scaled by statistics fitted on its aligned training rows, so one person changes every row and no "
            "release would be within its calibrated sensitivity; drop --preprocess (rows are scaled to unit norm "
            "anyway), or scale the files' columns by fixed constants that are not computed from their rows\n")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
