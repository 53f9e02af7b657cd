"""One scoring path (flower_vfl.core.scoring) for the evaluation rounds and the predict job, and
user-facing errors without tracebacks (flower_vfl.errors)."""

import logging
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import ConfigRecord, Context, Message, RecordDict

from _own_data_helpers import RANGES, node_configs, run_config, run_predict, run_train, write_a9a_files
from flower_vfl import errors
from flower_vfl.core import scoring as scoring
from flower_vfl.io.data import load_all
from flower_vfl.io import DataError
from flower_vfl.io.bundled import write_party_files


# ------------------------------------------------------------------ the shared scoring code
def test_party_scores_is_the_private_partys_prediction_and_combine_refuses_a_missing_party():
    from flower_vfl.privacy.party import normalize_rows
    rng = np.random.default_rng(0)
    D = sp.random(30, 6, density=0.5, random_state=1, format="csr")
    x = rng.standard_normal(6)
    np.testing.assert_array_equal(scoring.party_scores(D, x), D @ x)
    np.testing.assert_array_equal(scoring.party_scores(D, x, private=True), normalize_rows(D) @ x)
    assert scoring.party_scores is scoring.released_scores          # one function for every scoring site
    with pytest.raises(ValueError, match="a private party's model was never released; it cannot score rows"):
        scoring.released_scores(D, None, private=True)
    parts = {0: rng.standard_normal(30), 2: rng.standard_normal(30)}
    np.testing.assert_array_equal(scoring.combine(parts, 0.5, [0, 2]), parts[0] + parts[2] + 0.5)
    with pytest.raises(errors.PartyMissing, match=r"party \[1\] returned no scores; the score needs every "
                                                  r"party's block \(no zero-filling\)"):
        scoring.combine(parts, 0.5, range(3))


@pytest.fixture(scope="module")
def a9a_tiny():
    X, y, Xt, yt = load_all("a9a")
    return X[:500], y[:500], Xt[:200], yt[:200]


@pytest.mark.parametrize("private", [False, pytest.param(True, marks=pytest.mark.slow)])   # private: ~25 s
def test_predict_job_equals_the_training_time_evaluation_on_the_same_rows(tmp_path, a9a_tiny, private):
    """Held-out rows scored in the final evaluation round during training, then the same rows
    (the same files) scored by the predict job from the saved models: identical to 1e-12. A
    private party scores both times from its one released x̃ (one ledger entry)."""
    X, y, Xt, yt = a9a_tiny
    train, _ = write_a9a_files(tmp_path, X, y, Xt)
    test = write_party_files(Xt, yt, [f"t{i:06d}" for i in range(Xt.shape[0])], RANGES, tmp_path, "csv",
                             seed=5, missing={1: 0.05}, prefix="test")
    extra = {m: {"test-path": str(test[m])} for m in range(3)}
    if private:
        extra[2].update({"dp": True, "dp-epsilon": 1.0, "dp-lam": 3e-3,
                         "state-dir": str(tmp_path / "p2")})
    nodes = node_configs(train, test, "csv", tmp_path, extra=extra)      # score-path = test-path
    rc = run_config(train, test, tmp_path, **{"labels-test-path": str(test[0]), "max-rounds": 8})
    st, _ = run_train(rc, nodes)
    res = run_predict(rc, nodes)
    assert len(res["ids"]) == st.decision_test_.shape[0] == round(0.95 * 200)
    assert np.max(np.abs(res["scores"] - st.decision_test_)) <= 1e-12
    assert res["scores"].std() > 0.1                                   # a trained model, not zeros
    if private:
        assert [e["kind"] for e in st.privacy_[2]["ledger"]["entries"]] == ["eval"]


# ------------------------------------------------------------------ user-facing errors
def _format(record_args, exc):
    """What Flower's logger prints for ``log(ERROR, msg, exc_info=exc)`` (with our filter)."""
    from flwr.common.logger import FLOWER_LOGGER, log
    errors.install_log_filter()
    errors.install_log_filter()                       # idempotent
    assert sum(isinstance(f, errors.CleanUserErrors) for f in FLOWER_LOGGER.filters) == 1
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(logging.Formatter("%(levelname)s: %(message)s").format(record))

    h = Keep()
    FLOWER_LOGGER.addHandler(h)
    try:
        try:
            raise exc
        except Exception as caught:                   # a real traceback, as in Flower's handler
            log(logging.ERROR, *record_args, exc_info=caught)
    finally:
        FLOWER_LOGGER.removeHandler(h)
    return lines[0]


def test_every_user_facing_error_subclasses_user_error_and_keeps_its_builtin_kind():
    """One base (flower_vfl.errors.UserError) instead of a registry of names: a class that is
    moved or renamed cannot drop out of the one-line treatment."""
    import importlib
    kinds = {"flower_vfl.errors": {"PartyMissing": RuntimeError},
             "flower_vfl.config.schema": {"ConfigError": ValueError},
             "flower_vfl.io.sources": {"DataError": ValueError},
             "flower_vfl.io.psi": {"AlignmentError": ValueError},
             "flower_vfl.io.model_files": {"ModelFileError": ValueError},
             "flower_vfl.privacy.boundary": {"Refused": RuntimeError, "InvalidMessage": ValueError},
             "flower_vfl.privacy.ledger": {"BudgetExceeded": RuntimeError},
             "flower_vfl.privacy.party": {"ReplayRefused": RuntimeError, "PlanExceeded": RuntimeError},
             "flower_vfl.strategies.exchange": {"ReplyError": RuntimeError, "PartyFailed": RuntimeError,
                                                "PartyLost": RuntimeError},
             "flower_vfl.strategies.vertical_admm": {"PartyRefused": RuntimeError},
             "flower_vfl.strategies.dpiadmm": {"AgentRefused": RuntimeError},
             "flower_vfl.privacy.store": {"StoreError": RuntimeError, "LedgerMissing": RuntimeError}}
    for mod, classes in kinds.items():
        m = importlib.import_module(mod)
        for name, builtin in classes.items():
            cls = getattr(m, name)
            assert issubclass(cls, errors.UserError) and issubclass(cls, builtin), f"{mod}.{name}"
            assert errors.is_user_error(cls.__new__(cls))      # some take keyword-only details
    assert not errors.is_user_error(KeyError("x")) and not errors.is_user_error(None)
    assert not hasattr(errors, "USER_ERROR_NAMES")


def test_log_filter_drops_the_traceback_of_our_errors_only():
    msg = "/data/bank.csv: 2 duplicated ID(s) in column 'id'; each sample must appear once: deduplicate the export"
    out = _format(("%s raised an exception", "ServerApp"), DataError(msg))
    assert out == f"ERROR: ServerApp raised an exception: DataError: {msg}"
    from flower_vfl.strategies.exchange import PartyFailed
    out = _format(("Simulation raised an exception",), PartyFailed("node 7 failed the PSI answer step"))
    assert out == "ERROR: Simulation raised an exception: PartyFailed: node 7 failed the PSI answer step"
    bug = _format(("%s raised an exception", "ServerApp"), KeyError("x"))        # a bug keeps its traceback
    assert bug.startswith("ERROR: ServerApp raised an exception\nTraceback (most recent call last):")
    assert bug.endswith("KeyError: 'x'")


def test_party_handler_answers_a_user_error_with_an_error_reply_and_raises_a_bug():
    from flwr.common.constant import ErrorCode

    def bad_file(msg, context):
        raise DataError("/data/shop.csv: the ID column 'id' does not exist; fix the node-config key id-column")

    def bug(msg, context):
        raise ZeroDivisionError("division by zero")

    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=5, message_type="query.psi_answer")
    rep = errors.reply_user_errors(bad_file)(msg, ctx)
    assert rep.has_error() and rep.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert rep.error.reason == ("DataError: /data/shop.csv: the ID column 'id' does not exist; fix the "
                                "node-config key id-column")
    with pytest.raises(ZeroDivisionError):
        errors.reply_user_errors(bug)(msg, ctx)


def test_own_data_errors_are_user_errors(tmp_path, a9a_tiny):
    """The label owner's errors in the own-data job are of the user-facing kinds (no traceback)."""
    from flower_vfl.config.schema import ConfigError
    X, y, Xt, _ = a9a_tiny
    train, score = write_a9a_files(tmp_path, X[:100], y[:100], Xt[:50])
    nodes = node_configs(train, score, "csv", tmp_path)
    rc = run_config(train, score, tmp_path, **{"score-ids-path": ""})
    with pytest.raises(ConfigError, match="mode=predict needs the run-config key score-ids-path") as e:
        run_predict(rc, nodes)
    assert errors.is_user_error(e.value)
    with pytest.raises(DataError, match=r"nope.csv does not exist") as e:
        run_train(dict(rc, **{"labels-path": str(tmp_path / "nope.csv")}), nodes)
    assert errors.is_user_error(e.value)


def test_cli_prints_bad_data_as_one_line_and_exits_non_zero(tmp_path, a9a_tiny, capsys):
    """`flower-vfl fit --labels ... --party ...` on bad files: exit status 1 and one line naming
    the file and the fix, no traceback."""
    from flower_vfl.cli import commands as cli
    X, y, Xt, _ = a9a_tiny
    train, _ = write_a9a_files(tmp_path, X[:100], y[:100], Xt[:20])
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", "--labels", str(tmp_path / "nope.csv"), "--party", str(train[1])])
    assert e.value.code == 1
    assert capsys.readouterr().err == (f"flower-vfl: error: DataError: the label owner's file {tmp_path / 'nope.csv'} "
                                       "does not exist; fix --labels\n")
    bad = tmp_path / "dup.csv"
    lines = Path(train[2]).read_text().splitlines()
    bad.write_text("\n".join(lines + lines[1:3]) + "\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", "--labels", str(train[0]), "--party", str(train[1]), "--party", str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith(f"flower-vfl: error: DataError: {bad}: 2 duplicated ID(s) in column 'id'")
    assert "Traceback" not in err
