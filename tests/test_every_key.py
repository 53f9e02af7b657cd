"""Every accepted flag and key is honoured or refused (issue 19.7, 22.1).

- every flag of ``flower-vfl fit`` changes the in-process run (the report it writes);
- every flag of ``simulate``/``predict``/``deploy-local`` changes what is handed to Flower
  (the run config or the parties' node configs), Flower itself replaced by a recorder;
- every key of the vertical run config changes what the ServerApp builds, every key of a
  party's node config what the party builds, every horizontal key what the horizontal app
  builds, or it is one of the few listed with the test that covers it;
- a flag that would change nothing is refused with a message naming it.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_vfl.cli import commands as cli
from flower_vfl.config.schema import SCHEMA, ConfigError, run_defaults

#: a changed value for every flag (the defaults are the schema's)
CHANGED = {
    "dataset": "a9a", "num-parties": 3, "loss": "squared", "penalty": "l1", "lam": 1e-2, "rho": 1.0, "alpha": 1.5,
    "fit-intercept": "false", "acceleration": "none", "variant": "paper", "x-solver": "cg", "max-rounds": 5, "tol": 0.5,
    "party-model": "rff",
    "eval-every": 2, "label-epsilon": 2.0, "dp-parties": "0", "dp-epsilon": 3.0, "dp-delta": 1e-3,
    "dp-train-rounds": 2, "dp-eval-rounds": 2, "dp-lam": 1e-2, "dp-b1": 1.0, "dp-clip": 1.0,
    "dp-calibration": "paper", "dp-noise": "paper", "dp-accountant": "rdp", "dp-seed": 1,
    "round-timeout": 30.0, "party-wait": 5.0, "stragglers": "stale", "max-staleness": 2, "max-release": 10.0,
    "resume": "/tmp/r",
    "party-keys": "/tmp/k.json", "state-dir": "/tmp/s", "model-dir": "/tmp/m", "psi-structure": "gcs",
    "psi-fpr": 1e-6, "predictions-path": "/tmp/p.csv", "data-dir": "/tmp/d", "out-dir": "/tmp/o",
    "id-column": "uid", "label-column": "y", "preprocess": "standardize", "psi-max-asked": 2.0,
    "run-config": "lam=0.5", "max-release": 10.0, "secagg": "true", "route": "stacked-ssp",
    "wire-dtype": "float32", "dp-plan-expiry": 60.0, "secagg-require-all": "false",
    "secagg-trust": "honest-but-curious",
}


def _flags(command):
    parser = next(a for a in cli_parser()._actions if hasattr(a, "choices") and a.choices).choices[command]
    return sorted(a.option_strings[0][2:] for a in parser._actions if a.option_strings and a.dest != "help")


def cli_parser():
    import argparse
    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, argv=None, namespace=None):
        captured["p"] = self
        raise SystemExit(0)
    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            cli.main(["fit"])
    finally:
        argparse.ArgumentParser.parse_args = real
    return captured["p"]


# ------------------------------------------------------------------ flower-vfl fit
@pytest.fixture(autouse=True)
def _no_figure(monkeypatch):
    """report.json and metrics.csv as `fit` writes them, without run.png (matplotlib: ~1 s a run)."""
    from flower_vfl.reporting import report
    real = report.write_report
    monkeypatch.setattr(report, "write_report", lambda out_dir, config, history, final, extra=None, plot=True, **kw:
                        real(out_dir, config, history, final, extra, plot=False, **kw))


def _fit(tmp_path, name, *argv):
    """What `fit` reports (report.json's content)."""
    assert cli.main(["fit", "--max-rounds", "6", "--out-dir", str(tmp_path / name), *argv]) == 0
    rep = json.loads((tmp_path / name / "report.json").read_text())
    return json.dumps({"rounds": rep["rounds"], "final": {k: v for k, v in rep["final"].items() if k != "wall_time_s"},
                       "privacy": rep["privacy"]}, sort_keys=True, default=str)


def _strip_times(text):
    return re.sub(r'"(wall_time_s|time_s|elapsed[a-z_]*)": [0-9.e+-]+', "", text)


OWN_FLAGS = ("party", "labels", "labels-test", "party-test", "id-column", "label-column", "preprocess")


def test_fit_has_the_model_privacy_and_own_data_flags():
    assert set(_flags("fit")) == set(cli.MODEL_KEYS) | set(cli.PARTY_FLAGS) | {"dp-seed"} | set(OWN_FLAGS)


def test_every_model_flag_of_fit_changes_the_in_process_run(tmp_path, monkeypatch):
    from flower_vfl.io import data
    flags = [f for f in _flags("fit") if f in cli.MODEL_KEYS and f not in ("dp", "dp-parties")]
    base = _strip_times(_fit(tmp_path, "base"))
    for flag in flags:
        if flag == "out-dir":                                      # where the report goes
            assert (tmp_path / "base" / "report.json").is_file()
            continue
        if flag in ("dataset", "data-dir"):                        # what is read (a9a itself: test_privacy_party)
            for name in ("a9a", "a9a.t"):                          # fit checks a9a's files before reading
                (tmp_path / name).write_text("-1 1:1\n+1 2:1\n")

            def read(name, *a):
                raise LookupError((name, a))
            monkeypatch.setattr(data, "party_block", read)
            with pytest.raises(LookupError) as e:
                cli.main(["fit", "--dataset", "a9a", *(["--data-dir", str(tmp_path)] if flag == "data-dir" else [])])
            assert e.value.args[0] == ("a9a", (0, 2, str(tmp_path) if flag == "data-dir" else None))
            monkeypatch.undo()
            continue
        value = str(CHANGED[flag])
        assert _strip_times(_fit(tmp_path, flag, f"--{flag}", value)) != base, f"--{flag} {value} changed nothing"


def test_every_privacy_flag_of_fit_changes_the_in_process_run(tmp_path):
    base = _strip_times(_fit(tmp_path, "base"))
    private_base = _strip_times(_fit(tmp_path, "dp-base", "--dp", "--dp-seed", "0"))
    assert private_base != base                                   # --dp
    for flag in [f for f in _flags("fit") if f in cli.PARTY_FLAGS + ("dp-seed", "dp-parties")]:
        value = str(CHANGED[flag])
        got = _fit(tmp_path, flag, "--dp", "--dp-seed", "0", f"--{flag}", value)
        assert _strip_times(got) != private_base, f"--{flag} {value} changed nothing"


def test_fit_alpha_and_fit_intercept_reach_the_estimator(tmp_path):
    """The issue's case: the output equalled the default run. Now it equals the estimator's."""
    from flower_vfl import VerticalADMM
    from flower_vfl.io.data import labels, party_block
    _fit(tmp_path, "a", "--alpha", "1.5", "--fit-intercept", "false")
    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    blocks = [party_block("breast_cancer", m, 2)[0] for m in range(2)]
    ref = VerticalADMM(alpha=1.5, fit_intercept=False, max_rounds=6, tol=0).fit(blocks, labels("breast_cancer")[0])
    assert rep["final"]["objective"] == ref.history_[-1]["objective"]
    assert rep["config"]["alpha"] == 1.5 and rep["config"]["fit-intercept"] is False


@pytest.mark.parametrize("argv, says", [
    (["--dp-epsilon", "2"], "--dp-epsilon has no effect without --dp"),
    (["--dp-parties", "1"], "--dp-parties has no effect without --dp"),
    (["--dp", "--eval-every", "2"], "--eval-every with --dp: every intermediate evaluation would be one more privacy"),
    (["--preprocess", "standardize"], "--preprocess has no effect without --party"),
    (["--labels-test", "x.csv"], "--labels-test has no effect without --party"),
])
def test_a_fit_flag_that_would_change_nothing_is_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("command, flag", [("fit", "round-timeout"), ("fit", "state-dir"), ("fit", "psi-max-asked"),
                                           ("fit", "run-config"), ("simulate", "dp-seed"), ("fit", "model-dir")])
def test_flags_a_command_cannot_honour_do_not_exist_there(command, flag, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, f"--{flag}", "1"])
    assert e.value.code == 2 and f"unrecognized arguments: --{flag}" in capsys.readouterr().err


# ------------------------------------------------------------------ own data in process (issue 22.1)
@pytest.fixture
def bc_files(tmp_path):
    from sklearn.datasets import load_breast_cancer

    from flower_vfl.io.bundled import write_party_files
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    ranges = [(0, 10), (10, 20), (20, 30)]
    ids = [f"p{i:04d}" for i in range(len(y))]
    tr, te = np.arange(0, 400), np.arange(400, len(y))
    train = write_party_files(X[tr], y[tr], [ids[i] for i in tr], ranges, tmp_path / "train", "csv", seed=1)
    test = write_party_files(X[te], y[te], [ids[i] for i in te], ranges, tmp_path / "test", "csv", seed=2)
    return X, y, tr, te, train, test


def _own_fit(tmp_path, name, train, test, *argv):
    out = tmp_path / name
    files = ["--labels", str(train[0]), "--party", str(train[1]), "--party", str(train[2])]
    if test is not None:
        files += ["--labels-test", str(test[0]), "--party-test", str(test[1]), "--party-test", str(test[2])]
    assert cli.main(["fit", *files, "--max-rounds", "8", "--out-dir", str(out), *argv]) == 0
    return json.loads((out / "report.json").read_text())


def test_fit_on_files_honours_dp_test_files_and_every_model_flag(tmp_path, bc_files, capsys):
    """`fit --labels … --party … --dp` trained without privacy, ignored the test files and
    --num-parties. Now: private (the party's ledger in the report), scored on the held-out
    files exactly as the estimator on the same rows, and a wrong --num-parties is refused."""
    from flower_vfl import VerticalADMM
    from flower_vfl.config.settings import privacy_from_config
    X, y, tr, te, train, test = bc_files
    plain = _own_fit(tmp_path, "plain", train, test)
    ref = VerticalADMM(max_rounds=8, tol=0).fit([X[tr, a:b] for a, b in ((0, 10), (10, 20), (20, 30))], y[tr])
    f = ref.decision_function([X[te, a:b] for a, b in ((0, 10), (10, 20), (20, 30))])
    assert plain["final"]["test_accuracy"] == pytest.approx(float(np.mean((f > 0) == (y[te] > 0))), abs=1e-12)
    assert plain["final"]["objective"] == pytest.approx(ref.history_[-1]["objective"], rel=1e-12)
    assert plain["privacy"] == [] and plain["final"]["n_aligned_test"] == len(te)
    private = _own_fit(tmp_path, "dp", train, test, "--dp", "--dp-parties", "2", "--dp-seed", "0")
    (party,) = private["privacy"]
    assert party["party_id"] == 2 and party["totals"]["exact"] == pytest.approx(1.0, rel=1e-6)
    cfg = privacy_from_config(2, {}, {"partition-id": 2, "dp": True, "dp-epsilon": 1.0, "dp-seed": 0}, n_rows=len(tr))
    dp_ref = VerticalADMM(max_rounds=8, tol=0, privacy=[None, None, cfg]).fit(
        [X[tr, a:b] for a, b in ((0, 10), (10, 20), (20, 30))], y[tr])
    f = dp_ref.decision_function([X[te, a:b] for a, b in ((0, 10), (10, 20), (20, 30))])
    assert private["final"]["test_accuracy"] == float(np.mean((f > 0) == (y[te] > 0)))
    assert "privacy (each party's own ledger" in capsys.readouterr().out
    for flag in ("lam", "alpha", "fit-intercept", "acceleration", "penalty", "eval-every"):
        got = _own_fit(tmp_path, flag, train, test, f"--{flag}", str(CHANGED[flag]))
        assert got["rounds"] != plain["rounds"], f"--{flag} ignored on own data"
    with pytest.raises(SystemExit) as e:
        _own_fit(tmp_path, "n", train, test, "--num-parties", "2")
    assert e.value.code == 2 and "--num-parties=2 but the files make 3 parties (the label owner's own columns are " \
                                 "party 0); drop --num-parties" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", "--labels", str(train[0]), "--party", str(train[1]), "--party", str(train[2]),
                  "--labels-test", str(test[0]), "--party-test", str(test[1])])
    assert e.value.code == 2 and "give --labels-test and one --party-test per --party (2 --party, 1 --party-test)" \
        in capsys.readouterr().err


# ------------------------------------------------------------------ Flower commands: what is passed on
class _NoSuperLink:
    """simulate's own SuperLink (flower_vfl.deploy.local.simulation_superlink), not started."""

    def __init__(self, workdir, env_extra=None, command="simulate"):
        self.env, self.connection = dict(__import__("os").environ, **(env_extra or {})), None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class Recorder:
    """Flower replaced: what simulate/predict/deploy-local hand it."""

    def __init__(self, monkeypatch, tmp_path):
        self.calls = []
        nodes = tmp_path / "nodes.json"
        monkeypatch.setenv("FLOWER_VFL_NODE_CONFIG", str(nodes))
        monkeypatch.setenv("FLOWER_VFL_APP_DIR", str(tmp_path / "app"))

        def submit(app, conn, run_config, env, federation_config=None):
            self.calls.append({"app": str(app), "run_config": run_config, "federation": federation_config,
                               "nodes": json.loads(Path(env["FLOWER_VFL_NODE_CONFIG"]).read_text())})
            return "1"

        def deploy_local(workdir, n, rc, node_configs=None, app_dir=".", **kw):
            self.calls.append({"app": str(app_dir), "run_config": dict(rc), "n": n, "nodes": node_configs})
            return {"record": {"status": "finished:completed"}, "exit_code": 0, "run_id": 1, "out_dir": "o",
                    "logs": "l"}
        monkeypatch.setattr("flower_vfl.deploy.local.submit", submit)
        monkeypatch.setattr("flower_vfl.deploy.local.wait_run", lambda *a, **k: {"status": "finished:completed"})
        monkeypatch.setattr("flower_vfl.deploy.local.deploy_local", deploy_local)
        monkeypatch.setattr("flower_vfl.deploy.local.simulation_superlink", _NoSuperLink)   # no real SuperLink

    def run(self, *argv):
        assert cli.main(list(argv)) == 0
        return self.calls[-1]


@pytest.mark.parametrize("command", ["simulate", "predict", "deploy-local"])
def test_every_flower_flag_changes_what_is_handed_to_flower(command, tmp_path, monkeypatch, bc_files):
    rec = Recorder(monkeypatch, tmp_path)
    _, _, _, _, train, _ = bc_files
    files = ["--labels", str(train[0]), "--party", str(train[1]), "--party", str(train[2])]
    own_flags = {"party", "labels", "labels-test", "party-test"}
    local_flags = {"workdir", "insecure", "timeout", "isolation", "idle-poll"}     # deploy-local's own processes
    base = rec.run(command, *files)
    if command != "predict":                       # a predict job: the saved model decides privacy
        dp_base = rec.run(command, *files, "--dp")
        assert dp_base != base
    for flag in _flags(command):
        if flag in own_flags | local_flags or flag == "dp":
            continue
        value = str(CHANGED[flag])
        if flag in cli.PARTY_FLAGS or flag == "dp-parties":
            got, ref = rec.run(command, *files, "--dp", f"--{flag}", value), dp_base
        elif flag in ("num-parties", "dataset", "data-dir") and files:   # own data: one party per file
            with pytest.raises(SystemExit) as e:
                rec.run(command, *files, f"--{flag}", "2" if flag == "num-parties" else value)
            assert e.value.code == 2
            continue
        elif flag == "data-dir":                   # read only for a9a
            got, ref = rec.run(command, "--dataset", "a9a", f"--{flag}", value), rec.run(command, "--dataset", "a9a")
        else:
            got, ref = rec.run(command, *files, f"--{flag}", value), base
        assert got != ref, f"{command} --{flag} {value} changed nothing handed to Flower"


def test_simulate_hands_data_dir_to_the_parties_and_no_seed(tmp_path, monkeypatch):
    """The parties read their columns from their node config's data-dir only; --dp-seed is
    not a simulate flag (a party refuses a seed), and fit's seed never reaches a node config."""
    rec = Recorder(monkeypatch, tmp_path)
    (tmp_path / "a9a").mkdir()                       # simulate checks a9a's files before Flower starts
    for name in ("a9a", "a9a.t"):
        (tmp_path / "a9a" / name).write_text("-1 1:1\n+1 2:1\n")
    call = rec.run("simulate", "--dataset", "a9a", "--data-dir", str(tmp_path / "a9a"), "--dp", "--dp-parties", "1")
    assert call["nodes"] == {"0": {"partition-id": 0, "data-dir": str(tmp_path / "a9a")},
                             "1": {"partition-id": 1, "data-dir": str(tmp_path / "a9a"), "dp": True,
                                   "dp-epsilon": 1.0}}
    nodes = cli.local_node_configs({"dp": True, "dp-seed": 3, "dp-lam": 1e-3}, 2)
    assert all("dp-seed" not in cfg for cfg in nodes.values()) and nodes[1]["dp-lam"] == 1e-3


def test_simulate_and_predict_work_from_any_folder(tmp_path, monkeypatch):
    """Issue 22.3: the app is the package's (flower_vfl.cli.app), not the working folder's."""
    import tomllib

    rec = Recorder(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)                      # no pyproject.toml here
    call = rec.run("simulate", "--max-rounds", "2")
    app = Path(call["app"])
    assert app == tmp_path / "app" and not (tmp_path / "pyproject.toml").exists()
    shipped = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert shipped["components"] == {"serverapp": "flower_vfl.apps.server:app",
                                     "clientapp": "flower_vfl.apps.client:app"}
    assert shipped["config"] == run_defaults()


def test_a_run_config_typo_is_named_before_flower_is_called(tmp_path, monkeypatch, capsys):
    """Issue 22.8: flwr said 'Invalid run configuration'; the schema names the key first."""
    rec = Recorder(monkeypatch, tmp_path)
    for command in ("simulate", "deploy-local"):
        with pytest.raises(SystemExit) as e:
            cli.main([command, "--run-config", "max-round=3"])
        assert e.value.code == 2
        assert "unknown --run-config key 'max-round' (did you mean 'max-rounds'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--run-config", "dp-epsilon=3.0"])
    assert "--run-config key 'dp-epsilon'=3.0 is refused: it is a party's own privacy setting" in capsys.readouterr().err
    assert rec.calls == []
    assert "lam=0.5" in rec.run("simulate", "--run-config", "lam=0.5")["run_config"]


# ------------------------------------------------------------------ the ServerApp, the party, the horizontal app
#: keys checked by other tests, through the code that reads them
ELSEWHERE = {
    "out-dir": "tests/test_flower.py (report.json written there)",
    "data-dir": "test_simulate_hands_data_dir_to_the_parties_and_no_seed; tests/test_deploy_loopback.py",
    "mode": "tests/test_own_data.py (predict jobs)", "labels-path": "tests/test_own_data.py",
    "labels-test-path": "tests/test_own_data.py", "score-ids-path": "tests/test_own_data.py",
    "predictions-path": "tests/test_own_data.py", "model-dir": "tests/test_own_data.py",
    "psi-structure": "tests/test_psi.py", "psi-fpr": "tests/test_psi.py", "label-column": "tests/test_own_data.py",
    "id-column": "tests/test_own_data.py", "preprocess": "tests/test_own_data.py",
    "dp": "tests/test_trust_boundary.py", "dp-parties": "tests/test_trust_boundary.py",
    "party-model": "tests/test_party_models.py (the parties read it: the Flower path equals the engine)",
}


#: run-config keys the parties read (each party's x-update): test_every_node_config_key_...
PARTY_READS = ("lam", "x-solver")


def test_every_run_config_key_changes_what_the_server_app_builds(monkeypatch):
    from flower_vfl.apps import server as sa
    seen = []

    class Strategy:
        def __init__(self, *a, **kw):
            seen.append((a, kw))
    monkeypatch.setattr(sa, "VerticalADMMStrategy", Strategy)
    monkeypatch.setattr(sa, "StackedSSPStrategy", Strategy)      # route='stacked-ssp' builds the other strategy
    monkeypatch.setattr(sa, "labels", lambda name, data_dir=None: (name, data_dir))
    sa.make_strategy({})
    base = seen[-1]
    for key in run_defaults():
        if key in ELSEWHERE or key in PARTY_READS:
            continue
        value = CHANGED[key]
        value = value == "true" if SCHEMA[key].type is bool else SCHEMA[key].type(value)
        sa.make_strategy({key: value})
        assert seen[-1] != base, f"run config key {key!r}={value!r} changed nothing the ServerApp builds"


def test_every_node_config_key_changes_what_the_party_builds(monkeypatch, tmp_path):
    from flower_vfl.apps import client as ca
    seen = []

    class Party:
        def __init__(self, *a, **kw):
            seen.append((a, {k: v for k, v in kw.items() if k != "source"}, kw["source"].key))
    monkeypatch.setattr(ca, "VerticalPartyClient", Party)
    class Block(tuple):          # the arguments the block was read with, and a block's shape (dp-lam reads N)
        shape = (100, 3)
    monkeypatch.setattr(ca, "cached_party_block", lambda *a: (Block(a), None))

    def build(rc=None, **nc):
        ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 1, **nc}, state=RecordDict(),
                      run_config={"num-parties": 3, **(rc or {})})
        ca.make_client(ctx)
        return seen[-1]
    base = build()
    for key in PARTY_READS + ("penalty",):
        assert build({key: SCHEMA[key].type(CHANGED[key])}) != base, f"run config key {key!r} changed nothing"
    changed = {"partition-id": 0, "max-answers": 3, "min-rho": 0.5, "max-rho": 2.0, "data-dir": str(tmp_path),
               "state-dir": str(tmp_path / "s")}
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from flower_vfl.secagg import public_key_hex, signing_key_pem
    key = Ed25519PrivateKey.generate()
    (tmp_path / "k.pem").write_bytes(signing_key_pem(key))
    changed.update({"secagg-name": "alice", "secagg-signing-key": str(tmp_path / "k.pem"), "secagg-min-parties": 3,
                    "secagg-require": "party0", "secagg-bound": 5.0, "secagg-only": True})
    assert build(**{"secagg-signing-key": str(tmp_path / "k.pem"), "secagg-pins": f"party0={public_key_hex(key)}"}) \
        != build(**{"secagg-signing-key": str(tmp_path / "k.pem")})
    for key, value in changed.items():
        assert build(**{key: value}) != base, f"node config key {key!r}={value!r} changed nothing the party builds"
    private = {"dp-epsilon": 1.0}
    assert build(**private) != base and build(dp=False, **private) == base and build(dp=True, **private) == \
        build(**private)
    for key in cli.PARTY_FLAGS:
        got = build(**{**private, key: CHANGED[key]})
        assert got != build(**private), f"node config key {key!r}={CHANGED[key]!r} changed nothing the party builds"
    # moment-pool: read by the moment route's party only (route='moment'; without it the party refuses the
    # route, tests/test_moment_flower.py)
    def moment(**nc):
        return ca.make_moment_client(Context(run_id=1, node_id=1, node_config={"partition-id": 1, **nc},
                                             state=RecordDict(), run_config={"num-parties": 3}))
    assert moment(**{"moment-pool": "test"}).pool != moment().pool
    # num-partitions: set by Flower's simulation engine, informational (the schema says so)
    from flower_vfl.config.schema import RETIRED
    assert set(RETIRED).isdisjoint(SCHEMA)


def test_every_horizontal_key_changes_what_the_horizontal_app_builds(monkeypatch):
    from flower_vfl.apps import horizontal as hz
    from flower_vfl.config.schema import HORIZONTAL_NODE_KEYS, HORIZONTAL_RUN_KEYS
    seen = []
    monkeypatch.setattr(hz, "DPIADMMStrategy",
                        lambda *a, **kw: seen.append((a, {k: v for k, v in kw.items() if k not in ("X_test", "y_test")})))

    def fashion_mnist(data_dir=None):
        if data_dir is not None:
            raise RuntimeError(f"data-dir {data_dir} read")
        return np.zeros((40, 4)), np.arange(40) % 10, np.zeros((5, 4)), np.zeros(5)
    monkeypatch.setattr("flower_vfl.datasets.load_fashion_mnist", fashion_mnist)
    hz.make_server_strategy({})
    base = seen[-1]
    hz_values = {"hz-variant": "outp", "hz-iterations": 3, "hz-num-agents": 4, "hz-a": 2.0, "hz-beta": 1e-3,
                 "hz-trust": "constant", "hz-eval-every": 2}
    for key in HORIZONTAL_RUN_KEYS:
        if key in ("hz-split", "hz-dirichlet-alpha", "out-dir", "data-dir"):
            continue                           # the agent's partition, the report folder, the data folder: below
        hz.make_server_strategy({key: hz_values[key]})
        assert seen[-1] != base, key
    with pytest.raises(Exception, match="data-dir /nowhere read"):
        hz.make_server_strategy({"data-dir": "/nowhere"})
    agents = []
    monkeypatch.setattr(hz, "DPIADMMClient", lambda pid, X, y, k, privacy, store=None, **kw: agents.append(
        (pid, X, y, privacy, None if store is None else str(store.path))))
    monkeypatch.setattr("flower_vfl.horizontal.data.agent_partition",
                        lambda X, y, pid, num, kind, alpha: ((pid, num), (kind, alpha)))

    def agent(rc=None, **nc):
        hz.make_agent(Context(run_id=1, node_id=1, node_config={"partition-id": 1, **nc}, state=RecordDict(),
                              run_config=rc or {}))
        return json.dumps(agents[-1], default=str, sort_keys=True)
    a0 = agent()
    assert agent({"hz-split": "dirichlet"}) != a0 and agent({"hz-dirichlet-alpha": 0.1}) != a0
    node_values = {"dp-eps-bar": 2.0, "dp-delta-bar": 1e-3, "dp-sensitivity": "eq20", "dp-x-l1-max": 10.0,
                   "dp-max-epsilon": 5.0, "dp-seed": 3, "dp-delta": 1e-3, "partition-id": 2}
    for key in HORIZONTAL_NODE_KEYS:
        if key in ("data-dir", "state-dir", "num-partitions"):
            continue                           # the data folder (above), the store (tests/test_horizontal_flower.py)
        base_nc = {"dp-eps-bar": 1.0, "dp-max-epsilon": 50.0} if key.startswith("dp-") else {}
        if key == "dp-seed":                   # refused: seeded noise repeats in every run
            with pytest.raises(ConfigError, match="node config key 'dp-seed'=3 is refused"):
                agent(**{**base_nc, key: 3})
            continue
        assert agent(**{**base_nc, key: node_values[key]}) != agent(**base_nc), key
    with pytest.raises(ConfigError, match="node config key 'dp-eps-bar'=-1.0"):
        agent(**{"dp-eps-bar": -1.0, "dp-max-epsilon": 50.0})
