"""The command line refuses what cannot work with one line naming the flag and the fix, before any
round (and, for ``simulate``, before any Flower process): the CLI row of the attack/fault table
(out-dir a file or unwritable, --dp-eval-rounds 0, --num-parties 31, a9a missing or with a label 3,
--dp with l1, λ = 0 for a private party, `flower-vfl epsilon` thrice, rdp without opacus, squared loss
scored as a regression), the smaller rows of the first-hour walk (flags in errors instead of
node-config keys, no prefixes of flags, every file written printed, own-data reports naming the
own data, paper=inf explained, a fix for "no common IDs"). Every call goes through the real
entry point ``flower_vfl.cli.main`` in process; none starts Flower (``simulate``'s SuperLink is
replaced by a function that fails the test if reached)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.cli import main
from flower_vfl.cli.checks import BUNDLED_COLUMNS, cli_words
from flower_vfl.deploy import local

A9A = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a"
DISK_FIX = ("set --out-dir to a writable folder with free space on the label owner's disk (not a file; it is "
            "created if missing), or free/remount this one")


@pytest.fixture(autouse=True)
def _no_flower(monkeypatch):
    def launched(*a, **k):
        raise AssertionError("simulate reached Flower: the refusal came too late")
    monkeypatch.setattr(local, "simulation_superlink", launched)
    monkeypatch.setattr(local, "deploy_local", launched)


def refused(capsys, argv, code=2):
    """The one line ``flower-vfl: error: ...`` of a refused command (its exit code checked), and
    proof that no round ran (the in-process engine's progress bar never started)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == code
    out, err = capsys.readouterr()
    assert "ADMM rounds" not in err and "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("usage:", " "))]   # argparse's usage
    assert len(lines) == 1 and lines[0].startswith("flower-vfl: error: "), err
    return lines[0][len("flower-vfl: error: "):]


# ---------------------------------------------------------------------------- outputs, before training

@pytest.mark.parametrize("cmd", ["fit", "simulate"])
def test_an_out_dir_that_is_a_file_is_refused_before_training(capsys, tmp_path, cmd):
    f = tmp_path / "afile"
    f.write_text("x")
    assert refused(capsys, [cmd, "--out-dir", str(f), "--max-rounds", "2"], 1) == (
        f"DiskError: out-dir {f} is a file, not a folder; {DISK_FIX}")
    assert refused(capsys, [cmd, "--out-dir", str(f / "sub"), "--max-rounds", "2"], 1) == (
        f"DiskError: out-dir {f / 'sub'} is a file, not a folder (its parent {f} is a file); {DISK_FIX}")


def test_an_unwritable_out_dir_is_refused_before_training(capsys, tmp_path, monkeypatch):
    """A folder the probe cannot write (read-only, full): the OS error named, before any round."""
    import builtins
    real_open = builtins.open

    def deny(path, *a, **k):
        if ".flower-vfl-write-probe-" in str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", deny)
    out = tmp_path / "ro"
    assert refused(capsys, ["fit", "--out-dir", str(out)], 1) == (
        f"DiskError: out-dir {out} cannot be written (Permission denied); {DISK_FIX}")


def test_simulate_checks_the_label_owners_state_dir_in_flag_words(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    assert refused(capsys, ["simulate", "--state-dir", str(f)], 1) == (
        f"DiskError: state-dir {f} is a file, not a folder; set --state-dir to a writable folder with free space "
        "on the label owner's disk (not a file; it is created if missing), or free/remount this one")


# ---------------------------------------------------------------------------- the data

@pytest.mark.parametrize("cmd", ["fit", "simulate", "deploy-local"])
def test_more_parties_than_columns(capsys, cmd, tmp_path):
    extra = ["--workdir", str(tmp_path / "w")] if cmd == "deploy-local" else []
    assert refused(capsys, [cmd, "--num-parties", "31", *extra]) == (
        "--num-parties 31 is more parties than breast_cancer's 30 columns (each party needs at least one); give "
        "--num-parties between 1 and 30")


def test_the_bundled_widths_are_the_datas():
    from flower_vfl.io.data import load_all
    assert load_all("breast_cancer")[0].shape[1] == BUNDLED_COLUMNS["breast_cancer"]
    if (A9A / "a9a").is_file():
        assert load_all("a9a", str(A9A))[0].shape[1] == BUNDLED_COLUMNS["a9a"]


@pytest.mark.parametrize("cmd", ["fit", "simulate"])
def test_a9a_missing(capsys, tmp_path, cmd):
    assert refused(capsys, [cmd, "--dataset", "a9a", "--data-dir", str(tmp_path)]) == (
        f"a9a not found: --data-dir {tmp_path} has no a9a and no a9a.t; give --data-dir the folder holding a9a and "
        "a9a.t (LIBSVM files, e.g. from https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html#a9a)")


@pytest.mark.parametrize("cmd", ["fit", "simulate"])
def test_a9a_with_a_label_3(capsys, tmp_path, cmd):
    (tmp_path / "a9a").write_text("-1 1:1 5:1\n+1 2:1 7:1\n3 3:1 9:1\n")
    (tmp_path / "a9a.t").write_text("-1 1:1\n+1 2:1\n")
    assert refused(capsys, [cmd, "--dataset", "a9a", "--data-dir", str(tmp_path)]) == (
        f"a9a's file {tmp_path / 'a9a'} has 3 label value(s) (-1, 1, 3): --loss logistic needs exactly 2 classes; "
        "fix the file, or give --loss multinomial (more classes) or --loss squared (a number)")


# ---------------------------------------------------------------------------- private parties

@pytest.mark.parametrize("cmd", ["fit", "simulate"])
def test_private_settings_that_cannot_work(capsys, cmd):
    assert refused(capsys, [cmd, "--dp", "--dp-eval-rounds", "0"]) == (
        "--dp-eval-rounds 0: a private party would never release its final model, so the test score, the saved "
        "model and any prediction could not include it; give --dp-eval-rounds 1 (the default) or more")
    assert refused(capsys, [cmd, "--dp", "--penalty", "l1"]) == (
        "--dp: a private party supports --penalty l2 with a one-output loss (logistic, squared, hinge, sigmoid); "
        "got --penalty l1 --loss logistic: use --penalty l2, or drop --dp")
    assert refused(capsys, [cmd, "--dp", "--dp-lam", "0", "--lam", "0"]) == (
        "--dp: a private party needs λ > 0 (its x-update must be strongly convex), but --dp-lam and --lam are "
        "both 0; give --dp-lam (e.g. 3e-3) or --lam > 0")
    assert refused(capsys, [cmd, "--dp", "--dp-accountant", "paper", "--dp-epsilon", "50"]) == (
        "--dp-accountant paper cannot spend --dp-epsilon 50 over 1 release(s): the paper's Theorem 3 holds only "
        "for a per-round ε0 <= 1; give a smaller --dp-epsilon, more --dp-train-rounds, or --dp-accountant exact")
    assert refused(capsys, [cmd, "--label-epsilon", "1", "--loss", "squared"]) == (
        "--label-epsilon 1 needs --loss logistic (randomized response on binary labels, with a corrected logistic "
        "loss); got --loss squared: drop --label-epsilon or use --loss logistic")


@pytest.mark.parametrize("cmd", ["fit", "simulate"])
def test_rdp_without_opacus(capsys, monkeypatch, cmd):
    monkeypatch.setitem(sys.modules, "opacus", None)         # as if not installed: import fails, no spec
    assert refused(capsys, [cmd, "--dp", "--dp-accountant", "rdp"]) == (
        "--dp-accountant rdp needs opacus, which is not installed: pip install 'flower-vfl[opacus]', or use "
        "--dp-accountant exact (the default) or pld")


# ---------------------------------------------------------------------------- the parser

@pytest.mark.parametrize("argv, hint", [(["fit", "--max-round", "3"], " (did you mean --max-rounds?)"),
                                        (["simulate", "--max-round", "3"], " (did you mean --max-rounds?)"),
                                        (["ledger", "--state", "/x"], ""),
                                        (["report", "r", "--ou", "x.html"], " (did you mean --out?)")])
def test_no_prefix_of_a_flag_is_accepted(capsys, argv, hint):
    """Refused, with the command's closest flag when one is close (flower_vfl.cli.checks.CLIParser)."""
    assert refused(capsys, argv) == f"unrecognized arguments: {' '.join(argv[-2:])}{hint}"


@pytest.mark.parametrize("argv, message", [
    (["epsilon", "--noise-multiplier", "0", "--rounds", "20"],
     "--noise-multiplier 0: expected a finite number > 0 (σ over the sensitivity)"),
    (["epsilon", "--noise-multiplier", "nan", "--rounds", "20"],
     "--noise-multiplier nan: expected a finite number > 0 (σ over the sensitivity)"),
    (["epsilon", "--noise-multiplier", "10", "--rounds", "0"], "--rounds 0: expected an integer >= 1 (the number of releases)"),
    (["epsilon", "--noise-multiplier", "10", "--rounds", "20", "--delta", "0"],
     "--delta 0: expected a number between 0 and 1 (e.g. 1e-5)"),
    (["audit", "--dataset", "breast_cancer", "--num-parties", "31"], "--num-parties 31: expected 1 to 30 (breast_cancer's columns)"),
    (["audit", "--dataset", "breast_cancer", "--party", "2"], "--party 2: expected a party between 0 and 1"),
    (["audit", "--dataset", "breast_cancer", "--rounds", "0"], "--rounds 0: expected an integer >= 1"),
    (["audit", "--dataset", "breast_cancer", "--rows", "-5"], "--rows -5: expected an integer >= 0"),
])
def test_the_small_commands_refuse_bad_values(capsys, argv, message):
    assert refused(capsys, argv) == message


def test_errors_name_the_flag_not_the_config_key():
    flags = {"--data-dir", "--out-dir"}
    assert cli_words("a9a data file not found: /x/a9a. Set the node-config / run-config key data-dir to the folder",
                     flags) == "a9a data file not found: /x/a9a. Set --data-dir to the folder"
    assert cli_words("set the run-config key out-dir to a writable folder", flags) == "set --out-dir to a writable folder"
    # a key the command has no flag for, and the user's own --run-config, are left as they are
    assert cli_words("Set the node-config key state-dir to a folder", flags) == "Set the node-config key state-dir to a folder"
    assert cli_words("--run-config key 'out-dir'=1 is bad", flags) == "--run-config key 'out-dir'=1 is bad"


# ---------------------------------------------------------------------------- what a run prints and writes

def test_squared_loss_is_scored_as_a_regression(capsys, tmp_path):
    """`--loss squared` prints R² (scikit-learn's r2_score of the fitted model on the held-out rows),
    not an accuracy of 0.0."""
    from sklearn.metrics import r2_score

    from flower_vfl import VerticalADMM
    from flower_vfl.io.data import labels, party_block
    assert main(["fit", "--loss", "squared", "--max-rounds", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    row = json.loads(next(ln for ln in out if ln.startswith("{")))
    assert "test_accuracy" not in row
    blocks = [party_block("breast_cancer", m, 2) for m in range(2)]
    (y, yt) = labels("breast_cancer")
    ref = VerticalADMM(loss="squared", lam=1e-4, max_rounds=5, tol=0.0).fit([b[0] for b in blocks], y)
    assert row["test_r2"] == pytest.approx(r2_score(yt, ref.predict([b[1] for b in blocks])), abs=1e-9)
    assert "wrote no files (give --out-dir DIR for report.json, metrics.csv, run.png and report.html)" in out


def test_fit_names_every_file_it_wrote_and_explains_paper_inf(capsys, tmp_path):
    out_dir = tmp_path / "run"
    assert main(["fit", "--dp", "--dp-seed", "1", "--max-rounds", "3", "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {out_dir}/: report.json, metrics.csv, run.png, report.html" in out.splitlines()
    assert sorted(p.name for p in out_dir.iterdir() if p.is_file()) == sorted(
        ["report.json", "metrics.csv", "run.png", "report.html"])
    report = json.loads((out_dir / "report.json").read_text())
    tot = report["privacy"][0]["totals"]
    assert tot["paper"] == "inf"        # the accountant's answer over the noise drawn (not constant: see below)
    from flower_vfl.privacy.accounting import epsilon_spent
    z = report["privacy"][0]["noise_multiplier"]
    assert epsilon_spent(z, 1, 1e-5, "paper") == float("inf")
    from flower_vfl.reporting.report import PAPER_INF_NOTE
    assert out.count(f"    ({PAPER_INF_NOTE})") == 2        # once under each private party
    import html
    assert html.escape(PAPER_INF_NOTE, quote=True) in (out_dir / "report.html").read_text()


def _own_files(tmp_path, shift=0):
    from flower_vfl.io.bundled import write_table
    rng = np.random.default_rng(0)
    n = 40
    X = rng.standard_normal((n, 4))
    y = (X @ [1.0, -1.0, 0.5, 2.0] > 0).astype(int)
    ids = [f"p{i:03d}" for i in range(n)]
    lab = write_table(tmp_path / "owner.csv", ids, np.zeros((n, 0)), [], "csv", y=y)
    a = write_table(tmp_path / "a.csv", [f"p{i + shift:03d}" for i in range(n)], X[:, :2], ["a0", "a1"], "csv")
    b = write_table(tmp_path / "b.csv", ids, X[:, 2:], ["b0", "b1"], "csv")
    return lab, a, b


def test_no_common_ids_names_the_counts_and_the_fix(capsys, tmp_path):
    lab, a, b = _own_files(tmp_path, shift=100)
    assert refused(capsys, ["fit", "--labels", str(lab), "--party", str(a), "--party", str(b)], 1) == (
        "DataError: only 0 IDs are common to the label owner's training file and every party's (IDs shared with "
        "the label owner's 40: party 0: 0, party 1: 40); check that every file's --id-column (default 'id') holds "
        "the same IDs in the same format (e.g. '00123' vs '123', '7' vs '7.0') and that the files cover the same "
        "people")


def test_an_own_data_report_names_the_files_not_a_bundled_dataset(capsys, tmp_path):
    lab, a, b = _own_files(tmp_path)
    out_dir = tmp_path / "run"
    assert main(["fit", "--labels", str(lab), "--party", str(a), "--party", str(b), "--max-rounds", "3",
                 "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {out_dir}/: report.json, metrics.csv, run.png, report.html, model.npz" in out.splitlines()
    cfg = json.loads((out_dir / "report.json").read_text())["config"]
    assert "dataset" not in cfg and "data-dir" not in cfg
    assert cfg["data"] == f"own files: --labels {lab} --party {a} --party {b}"
    assert "breast_cancer" not in (out_dir / "report.html").read_text()


def test_a_flower_runs_own_data_config_is_recorded_without_the_default_dataset():
    """The Flower path's report config carries every declared key (Flower fills defaults, so
    dataset='breast_cancer' too): an own-data run's report drops it and names the label owner's file."""
    from flower_vfl.config.schema import run_defaults
    from flower_vfl.reporting.report import report_config
    cfg = report_config(dict(run_defaults(), **{"labels-path": "/data/owner.csv"}))
    assert "dataset" not in cfg and "data-dir" not in cfg
    assert cfg["data"] == ("own files: the label owner's /data/owner.csv; each party's file is named by its own "
                           "node config (not recorded here)")
    assert report_config(run_defaults())["dataset"] == "breast_cancer"     # a bundled run keeps it


def test_own_data_refusals_name_the_flag(capsys, tmp_path):
    from flower_vfl.io.bundled import write_table
    lab, a, b = _own_files(tmp_path)
    three = write_table(tmp_path / "owner3.csv", [f"p{i:03d}" for i in range(40)], np.zeros((40, 0)), [], "csv",
                        y=np.arange(40) % 3)
    own = ["--party", str(a), "--party", str(b)]
    assert refused(capsys, ["fit", "--labels", str(three), *own]) == (
        f"the label owner's file {three} (--labels) has 3 label value(s) (0, 1, 2): --loss logistic needs exactly 2 "
        "classes; fix the file, or give --loss multinomial (more classes) or --loss squared (a number)")
    assert refused(capsys, ["fit", "--labels", str(lab), "--party", str(a), "--party", str(a)]) == (
        f"--party {a} is given twice (parties 0 and 1): each party's file once, one --party per party")
    assert refused(capsys, ["fit", "--labels", str(lab), *own, "--label-column", "nope"], 1) == (
        f"DataError: {lab} has no label column 'nope' (columns: ['id', 'label']); set --label-column to the column "
        "holding the labels")
    f = tmp_path / "afile"
    f.write_text("x")
    assert refused(capsys, ["simulate", "--labels", str(lab), *own, "--model-dir", str(f)], 1) == (
        f"DiskError: model-dir {f} is a file, not a folder; set --model-dir to a writable folder with free space on "
        "the label owner's disk (not a file; it is created if missing), or free/remount this one")


def test_report_into_a_file_s_folder_is_refused(capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["fit", "--max-rounds", "2", "--out-dir", str(run)]) == 0
    capsys.readouterr()
    f = tmp_path / "afile"
    f.write_text("x")
    assert refused(capsys, ["report", str(run), "-o", str(f / "x.html")]) == (
        f"-o {f / 'x.html'}: its folder {f} cannot be made (File exists); give a path in a writable folder")


def test_the_server_apps_log_explains_paper_inf(caplog):
    """The ServerApp's final lines (what `flwr run --stream` and `flower-vfl simulate` show) explain
    paper=inf beside the party's totals, as `fit` does."""
    import logging
    from types import SimpleNamespace
    from flower_vfl.apps.server import log_final
    from flower_vfl.reporting.notes import PAPER_INF_NOTE
    rep = {"config": {"epsilon": 1.0, "delta": 1e-5}, "totals": {"exact": 1.0, "paper": float("inf")},
           "ledger": {"entries": [1, 2]}}
    st = SimpleNamespace(final_={}, privacy_={1: rep}, stopped_reason_=None)
    logger = logging.getLogger("flwr")
    logger.addHandler(caplog.handler)
    try:
        log_final(st)
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records]
    assert "party 1 privacy: budget (eps=1, delta=1e-05), spent exact=1, paper=inf, 2 releases" in lines
    assert f"party 1 privacy: {PAPER_INF_NOTE}" in lines
