"""run.png of a private in-process run (flower_vfl/reporting/plots.py): a label-DP run used to lose its
picture (the label owner's randomized-response ledger has no noise multiplier and no δ, float(None));
now every private party, the label owner included, gets its ε curve from an accountant over its own
ledger, equal to the total in the report."""

import json
import os
import subprocess
import sys
import warnings

import matplotlib.image
import numpy as np
import pytest

from flower_vfl.cli import commands as cli
from flower_vfl.reporting.plots import panels_with_data, privacy_curves, read_metrics


def test_label_dp_and_private_party_run_writes_its_picture(tmp_path):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)          # "run.png not written (...)" fails the test
        assert cli.main(["fit", "--max-rounds", "10", "--label-epsilon", "1", "--dp", "--dp-parties", "1",
                         "--dp-seed", "2", "--out-dir", str(out)]) == 0
    # three panels with a series (objective, residuals, privacy) and the final values below: 15 x 5.65 in
    assert matplotlib.image.imread(out / "run.png").shape[:2] == (508, 1350)
    report = json.loads((out / "report.json").read_text())
    by_party = {str(r["party_id"]): r for r in report["privacy"]}
    curves = privacy_curves(report)
    assert set(curves) == {"label owner (label-DP, randomized response)", "party 1 (budget ε=1.0, exact)"}
    rounds, eps = curves["label owner (label-DP, randomized response)"]
    assert rounds == [0, 10]                                     # released once, before round 1
    assert eps == [pytest.approx(by_party["label owner"]["totals"]["pld"], rel=1e-9)] * 2
    assert eps[0] == pytest.approx(1.0, rel=1e-4)
    rounds, eps = curves["party 1 (budget ε=1.0, exact)"]
    assert rounds[0] == 0 and eps[0] == 0.0 and rounds[-1] == 10
    assert eps[-1] == pytest.approx(by_party["1"]["totals"]["exact"], rel=1e-9)


def test_a_ledger_entry_without_accounting_fields_is_refused_by_name(tmp_path):
    """An entry the plot cannot account (neither a noise multiplier nor a flip probability) names
    the party and the missing field instead of failing on float(None)."""
    report = {"privacy": [{"party_id": 3, "ledger": {"entries": [{"round": 1}]}, "config": {"delta": 1e-5}}]}
    with pytest.raises(ValueError, match=r"party 3: ledger entry 1 has no noise_multiplier"):
        privacy_curves(report)


def _panels(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    return panels_with_data([(run_dir, read_metrics(run_dir), report, "r")])


def test_run_png_draws_only_panels_with_a_series(tmp_path):
    """Issue 22 item 10: run.png had six panels, of which two held one dot (the test metrics,
    evaluated once after training) and the privacy panel was empty. Now a panel is drawn only
    when the run has a series for it; the one-off test values are in the final-values text."""
    plain, evald = tmp_path / "plain", tmp_path / "evald"
    assert cli.main(["fit", "--max-rounds", "6", "--out-dir", str(plain)]) == 0
    assert cli.main(["fit", "--max-rounds", "6", "--eval-every", "2", "--out-dir", str(evald)]) == 0
    assert _panels(plain) == ["training objective", "residuals"]
    assert matplotlib.image.imread(plain / "run.png").shape[:2] == (508, 900)       # two panels + text strip
    cols = read_metrics(evald)
    assert [r for r, v in zip(cols["round"], cols["test_loss"]) if v == v] == [2.0, 4.0, 6.0]
    assert _panels(evald) == ["training objective", "test log-loss", "test accuracy", "residuals"]
    img = matplotlib.image.imread(evald / "run.png")
    assert img.shape[:2] == (765, 1350)                                              # 2 x 3 cells, text in one
    assert img[..., :3].std() > 0.05                                                 # not a blank canvas


def _stderr_of(args):
    code = "import sys; from flower_vfl.cli import main; sys.exit(main(sys.argv[1:]))"   # [project.scripts]
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_no_protobuf_warning_on_a_command_that_imports_flower(tmp_path):
    """Issue 22 item 10: flwr 1.42's generated protos (gencode 5.29) warn under protobuf 6 at
    import ("Protobuf gencode version 5.29.0 is exactly one major version older than the runtime
    version ..."), a block of 26 lines on every command that imports flwr (--run-config parsing,
    simulate, every `flwr` child). The entry point filters that one message, here and, through
    PYTHONWARNINGS, in the Flower processes it starts."""
    res = _stderr_of(["simulate", "--run-config", "max-rounds=oops"])   # imports flwr.common.config, then refuses
    assert res.returncode == 2 and "--run-config 'max-rounds=oops' is not 'key=value ...'" in res.stderr
    assert "protobuf" not in res.stderr.lower()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}   # other tests' main() may have set it
    raw = subprocess.run([sys.executable, "-c", "import flwr.common.config"], capture_output=True, text=True, env=env)
    assert "Protobuf gencode version" in raw.stderr        # the source is still there without the filter
    # a `flwr` child started by the command inherits the filter
    code = ("import os, subprocess, sys; from flower_vfl.cli import quiet_protobuf_gencode_warning as q; q(); "
            "sys.exit(subprocess.run([sys.executable, '-c', 'import flwr.common.config']).returncode)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == 0 and "protobuf" not in child.stderr.lower()
