"""Issue 22: one self-contained HTML page per run (report.html next to report.json: curves,
each party's protection and ledger, settings) and `flower-vfl report` overlaying several runs,
checked in a real headless browser (Debian's chromium-headless-shell, installed by scripts/setup-tests.sh): the
screenshot's size and ink, and the elements of the DOM chromium built."""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import matplotlib.image
import numpy as np
import pytest

from flower_vfl.cli.commands import main as cli   # not flower_vfl.cli.main: it sets PYTHONWARNINGS here

CHROMIUM = (shutil.which("chromium") or shutil.which("chromium-headless-shell")
            or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None))
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no headless browser (Debian package "
                                                             "`chromium-headless-shell`, installed by scripts/setup-tests.sh)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A plain run evaluated every 3 rounds and a private one (party 1 at ε=4 over 3 noisy
    training rounds + the final evaluation, labels at label-ε=1), both by `flower-vfl fit`."""
    base = tmp_path_factory.mktemp("runs")
    plain, private = base / "plain", base / "private"
    assert cli(["fit", "--max-rounds", "9", "--eval-every", "3", "--out-dir", str(plain)]) == 0
    assert cli(["fit", "--max-rounds", "8", "--label-epsilon", "1", "--dp", "--dp-parties", "1", "--dp-epsilon", "4",
                "--dp-train-rounds", "3", "--dp-seed", "1", "--out-dir", str(private)]) == 0
    return plain, private


class _Dom(HTMLParser):
    """Elements of an HTML document: (tag, attrs, text inside it, its pieces joined by tabs) in
    document order."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "circle", "line", "rect", "path"}

    def __init__(self, text):
        super().__init__()
        self.elements, self._open = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = [tag, dict(attrs), []]
        self.elements.append(el)
        if tag not in self.VOID:
            self._open.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append([tag, dict(attrs), []])

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for el in self._open:
            el[2].append(data)

    def find(self, tag, cls=None, **attrs):
        return [(a, "\t".join(t)) for g, a, t in self.elements if g == tag
                and (cls is None or cls in (a.get("class") or "").split())
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def _chromium(*args, tmp):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _ledger(report, party):
    return next(r for r in report["privacy"] if str(r["party_id"]) == party)


def test_each_run_writes_its_self_contained_page(runs):
    """fit writes report.html next to report.json; nothing on it is fetched (no script, link,
    image file or URL), and its figures are the report's: one ledger row per release, the ε
    after the last release = the party's own total, one settings row per recorded key."""
    plain, private = runs
    for run in runs:
        text = (run / "report.html").read_text()
        assert (run / "report.json").is_file() and (run / "run.png").is_file()
        assert not re.search(r"<script|<link|<img|<iframe|@import|https?:|\bsrc=|\bhref=", text, re.I)
        assert re.findall(r"url\(([^)]*)\)", text) == [f"#clip-{t}" for t in re.findall(r'id="clip-([^"]+)"', text)]
    report = json.loads((private / "report.json").read_text())
    dom = _Dom((private / "report.html").read_text())
    party = _ledger(report, "1")
    entries = party["ledger"]["entries"]
    assert [e["kind"] for e in entries] == ["train"] * 3 + ["eval"]
    rows = dom.find("tr", "ledger-row", data_party="1")
    assert len(rows) == 4
    cells = [t.split("\t") for _, t in rows]
    assert [c[1] for c in cells] == [str(e["round"]) for e in entries]          # round of each release
    assert cells[-1][-1] == f"{party['totals'][party['config']['accountant']]:.4g}" == "4"
    eps = [float(c[-1]) for c in cells]
    assert eps == sorted(eps) and eps[0] > 0
    owner = dom.find("tr", "ledger-row", data_party="label owner")
    assert len(owner) == 1 and owner[0][1].split("\t")[-1] == f"{_ledger(report, 'label owner')['totals']['pld']:.4g}"
    assert [a["data-key"] for a, _ in dom.find("tr", "setting")] == list(report["config"])
    assert len(dom.find("tr", "run-row")) == 1
    assert [a["data-panel"] for a, _ in dom.find("figure", "panel")] == \
        ["training objective", "residuals", "ε spent (each private party's ledger)"]


def test_report_command_refuses_a_folder_without_a_report(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        cli(["report", str(runs[0]), str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1
    assert err == (f"flower-vfl: error: RunFolderError: RUN_DIR {tmp_path / 'empty'} has no report.json; give the "
                   "folder a run wrote: the --out-dir of `flower-vfl fit` or `flower-vfl simulate`, or <workdir>/out "
                   "of `flower-vfl deploy-local`\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]                # nothing written
    with pytest.raises(SystemExit) as exc:
        cli(["report", str(runs[0]), "-o", str(tmp_path / "x.txt")])
    assert exc.value.code == 2 and "give a path ending in .html (the page) or .png (the picture)" in capsys.readouterr().err
    assert cli(["report", *map(str, runs), "-o", str(tmp_path / "both.png")]) == 0     # the PNG overlay as before
    assert matplotlib.image.imread(tmp_path / "both.png").shape[1] == 1350


@needs_chromium
def test_overlay_in_a_headless_browser(runs, tmp_path, capsys):
    """`flower-vfl report A B -o page.html`, opened by chromium: a 1280x2000 screenshot with
    ink on it (the runs' colours included), and a DOM with the title, one curve per run and
    series on shared axes, a table row per run, each party's ledger rows and the settings."""
    plain, private = runs
    page = tmp_path / "both.html"
    assert cli(["report", str(plain), str(private), "-o", str(page)]) == 0
    assert capsys.readouterr().out == f"wrote {page}\n"
    shot = tmp_path / "both.png"
    res = _chromium(f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri(), tmp=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    img = matplotlib.image.imread(shot)[..., :3]
    assert img.shape == (2000, 1280, 3)
    ink = img.min(axis=-1) < 0.9
    assert 0.03 < ink.mean() < 0.6 and img.std() > 0.05                       # drawn, not blank, not a black page
    for rgb in ((0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)):                      # run 0 blue, run 1 orange: curves
        near = np.abs(img * 255 - np.array(rgb)).max(axis=-1) < 20
        assert near.sum() > 300, rgb

    res = _chromium("--dump-dom", page.as_uri(), tmp=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = _Dom(res.stdout)
    assert dom.find("title")[0][1] == "flower-vfl: 2 runs"                  # the page's (then each curve's)
    assert [t for _, t in dom.find("h1")] == ["flower-vfl: 2 runs"]
    assert [a["data-run"] for a, _ in dom.find("tr", "run-row")] == ["0", "1"]
    reports = [json.loads((r / "report.json").read_text()) for r in runs]
    curves = dom.find("polyline", "curve")
    metrics = ("objective", "train_loss", "test_loss", "test_accuracy", "primal_residual", "dual_residual")
    for run, report in enumerate(reports):               # one curve per run and series, each point a round
        mine = [a for a, _ in curves if a["data-run"] == str(run) and a["data-series"] in metrics]
        want = {k: sum(isinstance(r.get(k), float) for r in report["rounds"]) for k in metrics}
        assert sorted(a["data-series"] for a in mine) == sorted(k for k, n in want.items() if n > 1)
        assert all(len(a["points"].split()) == want[a["data-series"]] for a in mine)
    assert {a["data-series"] for a, _ in curves if a["data-run"] == "0"} == set(metrics)   # evaluated every 3
    eps = [a for a, _ in curves if a["data-series"].startswith("epsilon")]
    assert {a["data-run"] for a in eps} == {"1"} and len(eps) == 2          # party 1 and the label owner
    assert len(dom.find("tr", "ledger-row", data_party="1")) == len(_ledger(reports[1], "1")["ledger"]["entries"])
    assert len(dom.find("tr", "ledger-row", data_party="label owner")) == 1
    settings = {a["data-key"]: (a.get("class"), t) for a, t in dom.find("tr", "setting")}
    assert set(settings) == set(reports[0]["config"]) | set(reports[1]["config"])
    assert "differs" in settings["max-rounds"][0] and settings["max-rounds"][1].split("\t") == ["max-rounds", "9", "8"]
    assert settings["dp"][1].split("\t") == ["dp", "(default)", "yes"]


@needs_chromium
def test_one_run_page_renders_its_protection(runs, tmp_path):
    """The page a private run wrote itself, as chromium builds it: the label owner's and party
    1's protection facts (budget, ε spent by its own accountants) and ledger."""
    plain, private = runs
    res = _chromium("--dump-dom", (private / "report.html").as_uri(), tmp=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = _Dom(res.stdout)
    report = json.loads((private / "report.json").read_text())
    assert dom.find("title")[0][1] == f"flower-vfl run {private.name} (admm, in-process)"
    parties = {a["data-party"]: t for a, t in dom.find("div", "party")}
    assert set(parties) == {"1", "label owner"}
    assert "epsilon=4, delta=1e-05" in parties["1"]
    spent = _ledger(report, "1")["totals"]
    assert ", ".join(f"{k}={v if isinstance(v, str) else format(v, '.4g')}" for k, v in spent.items()) in parties["1"]
    assert "label_epsilon=1" in parties["label owner"]


def test_the_server_app_writes_the_page_of_a_flower_run(tmp_path):
    """The ServerApp's run (through the in-process Grid): report.html next to report.json, with
    the label owner's protection (Flower keeps it apart, in ``label_privacy``), the per-party
    coverage of the final report and party 1's ledger, its ε = the party's own total."""
    from flwr.app import Context, RecordDict

    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 4, "out-dir": str(tmp_path), "label-epsilon": 2.0}
    grid = LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                     {100: {"partition-id": 0}, 101: {"partition-id": 1, "dp": True, "dp-epsilon": 2.0}}, rc)
    sa.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    report = json.loads((tmp_path / "report.json").read_text())
    dom = _Dom((tmp_path / "report.html").read_text())
    assert dom.find("title")[0][1] == f"flower-vfl run {tmp_path.name} (admm, flower)"
    assert {a["data-party"] for a, _ in dom.find("div", "party")} == {"1", "label owner"}
    (owner,) = dom.find("tr", "ledger-row", data_party="label owner")
    assert owner[1].split("\t")[-1] == f"{report['label_privacy']['totals']['pld']:.4g}" == "2"
    party = report["privacy"]["1"]
    rows = dom.find("tr", "ledger-row", data_party="1")
    assert len(rows) == len(party["ledger"]["entries"])
    assert rows[-1][1].split("\t")[-1] == f"{party['totals'][party['config']['accountant']]:.4g}" == "2"
    (coverage,) = [t for a, t in dom.find("table", "coverage")]
    assert "row-level DP of this party's training rows" in coverage and "label DP: randomized response" in coverage
    assert [a["data-key"] for a, _ in dom.find("tr", "setting")] == list(report["config"])
