"""run.png of a private in-process run (flower_vfl/reporting/plots.py): a label-DP run used to lose its
picture (the label owner's randomized-response ledger has no noise multiplier and no δ, float(None));
now every private party, the label owner included, gets its ε curve from an accountant over its own
ledger, equal to the total in the report."""

import json
import warnings

import matplotlib.image
import pytest

from flower_vfl.cli import commands as cli
from flower_vfl.reporting.plots import privacy_curves


def test_label_dp_and_private_party_run_writes_its_picture(tmp_path):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)          # "run.png not written (...)" fails the test
        assert cli.main(["fit", "--max-rounds", "10", "--label-epsilon", "1", "--dp", "--dp-parties", "1",
                         "--dp-seed", "2", "--out-dir", str(out)]) == 0
    assert matplotlib.image.imread(out / "run.png").shape[:2] == (765, 1350)   # 15 x 8.5 in at 90 dpi
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
