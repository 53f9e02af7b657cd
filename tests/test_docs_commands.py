"""The docs against the code, as a user reads them (README.md and docs/*.md; the benchmark
pages are the lead's and are not read here):

- every ``flower-vfl <command> --flag`` the docs show is a flag of that command, and every
  ``flower-vfl ...`` line of a code block parses as written (argparse: flags, choices, types);
- every key of a ``--node-config "..."`` / ``--run-config "..."`` string, and every key the prose
  calls a "node config `key`" / "run config `key`", is a key of the schema
  (``flower_vfl.config.schema.SCHEMA``); every ``FLOWER_VFL_*`` variable is declared
  (``ENVIRONMENT``);
- every complete config string passes the schema's parser; the party-model settings table gives
  the schema's defaults; every keyword passed to the project's classes is a parameter;
- every flag of a `python simulations/...` / `benchmarks/...` command is declared by the script;
  every repository path and relative link (with its #anchor) exists;
- no internal issue numbers ("#24");
- obvious mistakes are answered naming the flag or key and the fix (a missing --party file, a
  mistyped flag, a typo in `ledger --node-config`), and `deploy-local` with `secagg=true` pins keys;
- the Python snippets of README.md, docs/model-selection.md and (slow) docs/reproduction-horizontal.md
  run as written (on stand-in blocks for the names they leave to the reader) and give what their
  comments say, against references computed here (the estimator fitted directly, a closed-form
  Gaussian composition, basic composition).

docs/own-app.md and docs/two-machines.md are run by tests/test_own_app_page.py and
tests/test_two_machines_page.py. In-process, 15-30 s (the snippets are real fits).
"""

import argparse
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.config.schema import ENVIRONMENT, SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if not p.name.startswith("benchmarks")]


def _text(page: Path) -> str:
    """The page with shell line continuations joined."""
    return page.read_text().replace("\\\n", " ")


def _parser():
    from test_every_key import cli_parser
    return cli_parser()


def _flags(parser) -> dict:
    """Each sub-command's option strings (with its own sub-commands', e.g. ``certs node``)."""
    def of(p):
        out = {s for a in p._actions for s in a.option_strings}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for q in a.choices.values():
                    out |= of(q)
        return out
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: of(p) for name, p in sub.choices.items()}


def test_every_flag_the_docs_show_is_a_flag_of_its_command():
    flags = _flags(_parser())
    bad = []
    for page in PAGES:
        for line in _text(page).splitlines():
            for m in re.finditer(r"flower-vfl ([a-z][a-z-]*)((?:[^`|;#\n])*)", line):
                cmd, rest = m.group(1), m.group(2)
                if cmd == "commands" and page.name == "architecture.md":    # the layer diagram's label
                    continue
                if cmd not in flags:
                    bad.append(f"{page.name}: unknown command 'flower-vfl {cmd}'")
                    continue
                bad += [f"{page.name}: flower-vfl {cmd} has no {f}" for f in
                        re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest) if f not in flags[cmd]]
    assert bad == []


def test_every_flag_of_a_script_the_docs_run_is_declared_by_the_script():
    """``python simulations/x.py --flag`` / ``python benchmarks/y.py --flag``: the script declares
    ``"--flag"`` (its argparse source; the scripts are not imported here)."""
    bad, seen = [], 0
    for page in PAGES:
        text = re.sub(r"\n\s+(?=--)", " ", _text(page))
        for m in re.finditer(r"python (?:-W ignore )?((?:simulations|benchmarks)/[\w/]+\.py)((?:[^`\n|;#)])*)", text):
            script = ROOT / m.group(1)
            if not script.is_file():
                bad.append(f"{page.name}: {m.group(1)} does not exist")
                continue
            source = script.read_text()
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2)):
                seen += 1
                if f'"{flag}"' not in source and f"'{flag}'" not in source:
                    bad.append(f"{page.name}: {m.group(1)} has no {flag}")
    assert seen >= 10 and bad == []


def _code_lines():
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", _text(page), re.S):
            for line in block.splitlines():
                line = line.strip()
                if line.startswith("flower-vfl "):
                    yield page.name, line


def test_every_flower_vfl_line_of_a_code_block_parses_as_written():
    """argparse's own checks (unknown flag, a choice, a type, a missing value) on the docs' lines."""
    parser = _parser()
    lines = list(_code_lines())
    assert len(lines) >= 12
    for page, line in lines:
        argv = shlex.split(line, comments=True)[1:]
        if any(a.startswith("<") or a == "..." for a in argv):       # a placeholder the reader fills in
            continue
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{page}: `{line}` does not parse (exit {exc.code})")


def test_every_config_key_the_docs_name_is_a_schema_key():
    bad = []
    for page in PAGES:
        text = _text(page)
        for m in re.finditer(r"--(node-config|run-config)[ =]+\"([^\"]*)\"", text):
            if m.group(2) == "key=value ...":                          # the syntax, not a key
                continue
            bad += [f"{page.name}: --{m.group(1)} key {k!r}" for k in
                    re.findall(r"(?:^|\s)([a-z][a-z0-9-]*)=", m.group(2)) if k not in SCHEMA]
        for m in re.finditer(r"(node[- ]config|run[- ]config)(?: key)? `([a-z][a-z0-9-]*)", text):
            if m.group(2) not in SCHEMA:
                bad.append(f"{page.name}: {m.group(1)} key {m.group(2)!r}")
    table = (ROOT / "docs" / "own-data.md").read_text().split("| node-config key | meaning |", 1)[1].split("\n\n")[0]
    keys = re.findall(r"^\| `([a-z][a-z0-9-]*)` \|", table, re.M)
    assert len(keys) >= 14
    bad += [f"own-data.md: node-config table key {k!r}" for k in keys if k not in SCHEMA]
    assert bad == []


def test_every_complete_config_string_of_the_docs_is_accepted():
    """A ``--node-config "..."`` / ``--run-config "..."`` string without placeholders (``<m>``,
    ``...``, ``$PWD``) passes the schema's parser: types, ranges, and no run key in a node config."""
    from flwr.common.config import parse_config_args

    from flower_vfl.config.schema import parse_node_config, parse_run_config
    checked = 0
    for page in PAGES:
        for kind, text in re.findall(r"--(node-config|run-config) \"([^\"]*)\"", _text(page)):
            if re.search(r"<|\.\.\.|\$|key=value", text):
                continue
            config = parse_config_args([text])
            if kind == "node-config":
                parse_node_config(config, {"num-parties": 3})
            else:
                parse_run_config(config)
            checked += 1
    assert checked >= 8


def test_the_party_model_settings_table_gives_the_schemas_defaults():
    text = (ROOT / "docs" / "party-models.md").read_text().split("## Settings", 1)[1]
    rows = re.findall(r"^\| `([a-z][a-z0-9-]*)` \| [^|]+ \| ([^|]+) \|", text, re.M)
    assert len(rows) >= 14
    for key, shown in rows:
        default, shown = SCHEMA[key].default, shown.strip().strip("`")
        if isinstance(default, bool) or isinstance(default, str):
            assert str(default).lower() == shown.lower(), key
        else:
            assert float(shown) == default, key


def _keywords(call: str) -> set:
    """The keyword arguments at the top level of ``call`` (the text inside the parentheses)."""
    depth, top = 0, []
    for ch in call:
        depth += ch in "([{"
        depth -= ch in ")]}"
        top.append(ch if depth == 0 else " ")
    return set(re.findall(r"(?<![\w.=])([a-z_][a-z0-9_]*)\s*=(?!=)", "".join(top)))


def test_every_keyword_argument_the_docs_pass_to_the_projects_classes_exists():
    """``VerticalADMM(x_solver=...)``, ``PrivacyConfig(seed=...)`` ...: each keyword, in prose or
    in a snippet, is a parameter of the class."""
    import inspect

    from flower_vfl import VerticalADMM
    from flower_vfl.estimator.blocked import BlockedVerticalADMM, PartyColumnTransformer
    from flower_vfl.privacy import PrivacyConfig
    from flower_vfl.strategies import VerticalADMMStrategy
    from flower_vfl.strategies.config import StrategyConfig
    classes = {c.__name__: set(inspect.signature(c.__init__).parameters) for c in (
        VerticalADMM, PrivacyConfig, BlockedVerticalADMM, PartyColumnTransformer)}
    # the strategy's **settings are StrategyConfig's fields (VerticalPartyClient's *args/**kwargs: not checked)
    classes["VerticalADMMStrategy"] = (set(inspect.signature(VerticalADMMStrategy.__init__).parameters)
                                       | set(StrategyConfig.__dataclass_fields__))
    bad, calls = [], 0
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"\b(%s)\(" % "|".join(classes), text):
            end, depth = m.end(), 1
            while end < len(text) and depth:
                depth += text[end] == "("
                depth -= text[end] == ")"
                end += 1
            calls += 1
            unknown = _keywords(text[m.end():end - 1]) - classes[m.group(1)]
            bad += [f"{page.name}: {m.group(1)}({k}=...)" for k in sorted(unknown)]
    assert calls >= 20 and bad == []


def test_every_environment_variable_the_docs_name_is_declared():
    named = {(page.name, v) for page in PAGES for v in re.findall(r"FLOWER_VFL_[A-Z][A-Z_]*[A-Z]", page.read_text())}
    assert named, "the docs name FLOWER_VFL_NODE_CONFIG at least"
    assert {(p, v) for p, v in named if v not in ENVIRONMENT} == set()


def test_the_docs_name_no_internal_issue_number():
    hits = [f"{page.name}: {m.group(0)!r}" for page in PAGES
            for m in re.finditer(r"(?<![\w&/])#\d+\b|\b[Ii]ssue \d+\b", page.read_text())]
    assert hits == []


def _anchors(page: Path) -> set:
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", page.read_text(), re.M)}


def test_every_file_and_link_the_docs_name_exists():
    """Repository paths (tests/..., benchmarks/..., flower_vfl/... or a module path under it; an
    output prefix such as ``--out simulations/results/x`` names files starting with it) and
    relative Markdown links with their #anchors."""
    bad = []
    for page in PAGES:
        text = page.read_text()
        paths = r"(?<![\w./-])((?:tests|benchmarks|simulations|scripts|flower_vfl|docs|\.ci)/[\w./-]*\w)"
        for m in set(re.findall(paths, text)):
            path = ROOT / m
            if not (path.exists() or (ROOT / "flower_vfl" / m).exists() or any(path.parent.glob(path.name + "*"))):
                bad.append(f"{page.name}: {m}")
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("http://", "https://")):
                continue
            name, _, anchor = link.partition("#")
            target = page.parent / name if name else page
            if not target.exists():
                bad.append(f"{page.name}: link {link}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                bad.append(f"{page.name}: anchor {link}")
    assert bad == []


def test_a_missing_party_file_is_named_with_its_flag(tmp_path, capsys):
    """An obvious mistake on the command line: the message names the file and the flag to fix,
    before any round (not the node-config key a CLI user never wrote)."""
    from flower_vfl.cli import commands as cli
    from flower_vfl.io.data import write_bundled
    write_bundled("breast_cancer", str(tmp_path / "demo"), 2)
    labels, party = tmp_path / "demo" / "train-party0.csv", tmp_path / "demo" / "train-party1.csv"
    for argv, flag, path in (
            (["--party", "nope.csv"], "--party", "nope.csv"),
            (["--party", str(party), "--labels-test", "t.csv", "--party-test", str(party)], "--labels-test", "t.csv"),
            (["--party", str(party), "--labels-test", str(labels), "--party-test", "u.csv"], "--party-test", "u.csv")):
        with pytest.raises(SystemExit) as e:
            cli.main(["fit", "--labels", str(labels), *argv])
        assert e.value.code == 1
        assert capsys.readouterr().err == (f"flower-vfl: error: DataError: the file {path} given with {flag} does not "
                                           f"exist; fix {flag}\n")


@pytest.mark.parametrize("argv, says", [
    (["simulate", "--max-round", "3"], "unrecognized arguments: --max-round 3 (did you mean --max-rounds?)\n"),
    (["deploy-local", "--workdirr", "w"], "unrecognized arguments: --workdirr w (did you mean --workdir?)\n"),
    (["simulate", "--workdirr", "w"], "unrecognized arguments: --workdirr w\n"),   # deploy-local's flag only
    (["ledger", "--stat-dir", "s"], "unrecognized arguments: --stat-dir s (did you mean --state-dir?)\n"),
])
def test_a_mistyped_flag_is_answered_with_the_commands_closest_flag(argv, says, capsys):
    from flower_vfl.cli import commands as cli
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and capsys.readouterr().err.endswith(f"flower-vfl: error: {says}")


def test_a_typo_in_the_ledgers_node_config_is_refused_not_read_as_the_default_store(tmp_path, capsys, monkeypatch):
    """`flower-vfl ledger --node-config "... state-dri=..."` listed the per-user default store
    (another party state) as if it were the SuperNode's; now the key is named."""
    from flower_vfl.cli import commands as cli
    monkeypatch.setenv("FLOWER_VFL_STATE_DIR", str(tmp_path / "default"))
    with pytest.raises(SystemExit) as e:
        cli.main(["ledger", "--node-config", f"partition-id=1 state-dri='{tmp_path}'"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "flower-vfl: error: unknown --node-config key 'state-dri' (did you mean 'state-dir'?); the ledger reads "
        "state-dir and dp-plan-expiry from the SuperNode's node config\n")
    assert cli.main(["ledger", "--node-config", f"partition-id=1 state-dir='{tmp_path / 'own'}'"]) == 2
    assert f"no party store at {tmp_path / 'own'}" in capsys.readouterr().err


def test_deploy_local_with_secagg_pins_each_partys_key(tmp_path, monkeypatch):
    """README's `secagg=true` on `flower-vfl deploy-local` failed at the key adverts (a deployed
    SuperNode without secagg-pins refuses), with no flag to fix it. The command now gives each
    SuperNode its own Ed25519 key (0600) and pins every other party's public key. Flower replaced by
    the recorder of tests/test_every_key.py; the real run: 32 s (3 rounds, finished:completed)."""
    import stat

    from test_every_key import Recorder

    from flower_vfl.secagg import load_signing_key, parse_pins, public_key_hex
    rec = Recorder(monkeypatch, tmp_path)
    plain = rec.run("deploy-local", "--num-parties", "3", "--workdir", str(tmp_path / "w"))
    assert all("secagg-pins" not in cfg for cfg in plain["nodes"].values())
    nodes = rec.run("deploy-local", "--num-parties", "3", "--run-config", "secagg=true",
                    "--workdir", str(tmp_path / "w"))["nodes"]
    public = {}
    for m, cfg in nodes.items():
        path = Path(cfg["secagg-signing-key"])
        assert path.parent == tmp_path / "w" / "secagg" and stat.S_IMODE(path.stat().st_mode) == 0o600
        public[m] = public_key_hex(load_signing_key(path))
    assert len(set(public.values())) == 3
    for m, cfg in nodes.items():
        pins = {name: public_key_hex(key) for name, key in parse_pins(cfg["secagg-pins"]).items()}
        assert pins == {f"party{j}": public[j] for j in nodes if j != m}


# ------------------------------------------------------------------ the Python snippets
def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of a Gaussian mechanism with μ = sensitivity / σ (Balle and Wang 2018, Thm. 8),
    by bisection on δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)."""
    from scipy.stats import norm

    def d(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def _mu_for(eps: float, delta: float) -> float:
    lo, hi = 1e-6, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _gaussian_epsilon(mid, delta) < eps else (lo, mid)
    return hi


def test_the_readme_python_api_snippets_run_as_written():
    from sklearn.datasets import load_breast_cancer

    from flower_vfl import VerticalADMM
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    ns = {"X_hospital": X[:400, :15], "X_clinic": X[:400, 15:], "y": y[:400],
          "X_hospital_test": X[400:, :15], "X_clinic_test": X[400:, 15:]}
    plain, private = _blocks("README.md")
    exec(compile(plain, "README.md (Python API)", "exec"), ns)
    ref = VerticalADMM(loss="logistic", penalty="l2", lam=1e-4).fit([X[:400, :15], X[:400, 15:]], y[:400])
    np.testing.assert_array_equal(ns["model"].predict_proba([X[400:, :15], X[400:, 15:]]),
                                  ref.predict_proba([X[400:, :15], X[400:, 15:]]))
    assert ns["model"].history_[-1]["objective"] == ref.history_[-1]["objective"]
    exec(compile(private, "README.md (private clinic)", "exec"), ns)
    totals = ns["model"].privacy_report()[0]["totals"]          # "ε spent, by every accountant, from its ledger"
    assert totals["exact"] == pytest.approx(1.0, rel=1e-6) and totals["pld"] == pytest.approx(1.0, rel=1e-6)
    assert set(ns["model"].predict([X[400:, :15], X[400:, 15:]])) <= {0, 1}


def test_the_model_selection_snippets_run_as_written(tmp_path, monkeypatch):
    from sklearn.model_selection import cross_val_score

    from flower_vfl import VerticalADMM
    from flower_vfl.privacy import PrivacyConfig
    monkeypatch.chdir(tmp_path)                                  # the ledger folder the snippet names
    rng = np.random.default_rng(0)
    D1, D2 = rng.standard_normal((240, 66)), rng.standard_normal((240, 57))
    y = (np.hstack([D1, D2]) @ rng.standard_normal(123) + 0.5 * rng.standard_normal(240) > 0).astype(int)
    search_block, prep_block, private_block = _blocks("docs/model-selection.md")
    ns = {"D1": D1, "D2": D2, "y": y}
    exec(compile(search_block, "model-selection.md (search)", "exec"), ns)
    best = ns["search"].best_params_["lam"]
    assert best in (1e-4, 1e-3, 1e-2)
    ref = VerticalADMM(lam=best, max_rounds=50).fit([D1, D2], y)       # the refit: VerticalADMM on the blocks
    np.testing.assert_allclose(np.concatenate(ns["search"].best_estimator_.coef_), np.concatenate(ref.coef_),
                               rtol=0, atol=1e-12)
    # the party preprocessing: one-hot of 2 columns of 3 values each (6), degree-2 features of 3 (10)
    ns["X"] = rng.integers(0, 3, (240, 5)).astype(float)
    exec(compile(prep_block, "model-selection.md (preprocessing)", "exec"), ns)
    assert list(ns["model"][-1].block_widths_) == [6, 10]
    # every fit charged to one ledger: 3 fits at ε = 0.5 compose exactly (the Gaussian closed form)
    ns.update(X=np.hstack([D1, D2]), PrivacyConfig=PrivacyConfig, cross_val_score=cross_val_score)
    exec(compile(private_block, "model-selection.md (private)", "exec"), ns)
    from flower_vfl.cli import commands as cli
    import contextlib
    import io
    import json
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["ledger", "--state-dir", "selection-ledger/", "--json"]) == 0
    spent = json.dumps(json.loads(out.getvalue()))
    mu = _mu_for(0.5, 1e-5)
    want = _gaussian_epsilon(math.sqrt(3) * mu, 1e-5)
    got = [float(v) for v in re.findall(r'"spent[a-z_]*": ([0-9.e+-]+)', spent)]
    assert any(v == pytest.approx(want, rel=1e-4) for v in got), (want, spent[:800])
    # the page's own figure: "three fits at ε = 1, δ = 1e-5 total 1.83, not 3"
    assert round(_gaussian_epsilon(math.sqrt(3) * _mu_for(1.0, 1e-5), 1e-5), 2) == 1.83


@pytest.mark.slow    # Fashion-MNIST, 10 agents, T = 100: 36 s in pytest at load ~4 on 2 cores (82 s as a script)
def test_the_horizontal_page_snippet_runs_as_written():
    """docs/reproduction-horizontal.md's snippet: 10 agents of 6000 rows, pixels in [0, 1], and the
    privacy it reports per agent: T·eps_bar by basic composition (the closed form), PLD below it."""
    block, = _blocks("docs/reproduction-horizontal.md")
    ns = {}
    try:
        exec(compile(block.split("res = run_dpiadmm")[0], "reproduction-horizontal.md (data)", "exec"), ns)
    except (FileNotFoundError, OSError) as e:            # the Debian package is the project's install step
        pytest.skip(f"Fashion-MNIST not installed: {e}")
    assert len(ns["Xp"]) == 10 and all(X.shape == (6000, 784) for X in ns["Xp"])
    assert min(X.min() for X in ns["Xp"]) == 0.0 and max(X.max() for X in ns["Xp"]) == 1.0
    ns["report"] = None
    exec(compile(block.replace("res.privacy(delta=1e-5)", "report = res.privacy(delta=1e-5)"),
                 "reproduction-horizontal.md", "exec"), ns)
    assert len(ns["report"]) == 10
    for agent in ns["report"]:
        assert agent["releases"] == 100 and agent["eps_bar"] == 1.0
        assert agent["epsilon_basic"] == pytest.approx(100 * 1.0, rel=1e-12)
        assert 0 < agent["epsilon_pld"] < agent["epsilon_basic"]
