"""Every configuration key, through the run config (ServerApp start), a SuperNode's node config
and the command line: a wrong type, an out-of-range value, an unknown key, a missing
partition-id each stop the run before any round with an error naming the key and what is
allowed. The key table of docs/config-keys.md is the schema's."""

import math
import re
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from flower_vfl.cli import commands as cli
from flower_vfl.apps import server as sa
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.config.schema import SCHEMA, ConfigError, markdown_table, parse_node_config, parse_run_config

ROOT = Path(__file__).resolve().parents[1]
CHECKED = {k: s for k, s in SCHEMA.items() if s.type is not object}


def bad_values(spec):
    """(value, what the error must say) for a wrong type, each violated bound, a bad choice."""
    wrong = {bool: "yes", int: 3.5, float: "x", str: 1}[spec.type]
    out = [wrong]
    if spec.type in (int, float):
        if spec.lo is not None:
            out.append(spec.lo if spec.lo_open else spec.lo - 1)
        if spec.hi is not None:
            out.append(spec.hi if spec.hi_open else spec.hi + 1)
    if spec.type is float:
        out += [math.nan, math.inf]
    if spec.choices is not None:
        out.append("bogus")
    return out


CASES = [(k, v) for k, s in CHECKED.items() for v in bad_values(s)]


class NoRounds(LocalGrid):
    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("a message was sent before the configuration was checked")


RUN_SCOPES = ("run", "node-first", "both")


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES if CHECKED[k].scope in RUN_SCOPES])
def test_bad_run_config_stops_the_server_app_before_any_message(key, value):
    spec = SCHEMA[key]
    rc = {"dataset": "breast_cancer", key: value}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(ConfigError) as err:
        sa.main(NoRounds({}, {}, rc), ctx)
    msg = str(err.value)
    assert msg.startswith(f"run config key {key!r}={value!r}")
    assert f"expected {spec.allowed()}" in msg


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES
                                       if CHECKED[k].scope in ("node", "node-first", "party", "both")])
def test_bad_node_config_is_refused_naming_the_key(key, value):
    nc = {"partition-id": 0, key: value} if key != "partition-id" else {key: value}
    with pytest.raises(ConfigError) as err:
        parse_node_config(nc, {"num-parties": 2})
    assert str(err.value).startswith(f"node config key {key!r}={value!r}")
    assert f"expected {SCHEMA[key].allowed()}" in str(err.value)


@pytest.mark.parametrize("key", [k for k, s in CHECKED.items() if s.scope == "run"])
def test_node_config_may_not_set_run_keys(key):
    with pytest.raises(ConfigError, match=re.escape(f"node config key {key!r}={SCHEMA[key].default!r} is refused: "
                                                    f"only the run config may set {key!r}")):
        parse_node_config({"partition-id": 0, key: SCHEMA[key].default}, {})


@pytest.mark.parametrize("key", [k for k, s in CHECKED.items() if s.scope == "node"])
def test_run_config_may_not_set_node_keys(key):
    with pytest.raises(ConfigError, match=re.escape(f"run config key {key!r} can only be set in a SuperNode's "
                                                    "node config")):
        parse_run_config({key: 1})


def test_missing_and_out_of_range_partition_id_and_unknown_keys():
    with pytest.raises(ConfigError, match=r"node config key 'partition-id' is missing: every SuperNode must say"):
        parse_node_config({"data-dir": "/d"}, {})
    with pytest.raises(ConfigError, match=r"'partition-id'=2 is out of range: expected an integer between 0 and 1 "
                                          r"\(num-parties=2\)"):
        parse_node_config({"partition-id": 2}, {"num-parties": 2})
    with pytest.raises(ConfigError, match=r"unknown run config key 'max-round' \(did you mean 'max-rounds'\?\)"):
        parse_run_config({"max-round": 3})
    with pytest.raises(ConfigError, match=r"unknown node config key 'partition_id' \(did you mean 'partition-id'\?\)"):
        parse_node_config({"partition_id": 0}, {})
    # a node config is never pointed at a run-only key: 'max-round' is close to the run key 'max-rounds'
    with pytest.raises(ConfigError) as err:
        parse_node_config({"partition-id": 0, "max-round": 3}, {})
    assert str(err.value).startswith("unknown node config key 'max-round' (did you mean 'max-rho'?); known keys: ")
    listed = str(err.value).split("known keys: ")[1].split(", ")
    assert "max-rounds" not in listed and "partition-id" in listed and "dp-epsilon" in listed
    with pytest.raises(ConfigError, match=r"run config key 'loss'='logistc' is not allowed \(did you mean "
                                          r"'logistic'\?\)"):
        parse_run_config({"loss": "logistc"})
    with pytest.raises(ConfigError, match=r"run config key 'dp-parties'='2': expected party ids between 0 and 1"):
        parse_run_config({"dp-parties": "2"})


def test_good_values_parse_to_typed_settings():
    cfg = parse_run_config({"rho": 1, "max-rounds": 3, "stragglers": "stale"})
    assert cfg["rho"] == 1.0 and isinstance(cfg["rho"], float) and cfg["max-rounds"] == 3
    node = parse_node_config({"partition-id": 1, "dp": True, "dp-epsilon": 2}, {"num-parties": 2})
    assert node["partition-id"] == 1 and node["dp-epsilon"] == 2.0 and node["num-parties"] == 2


def _command_for(key):
    """The command whose flags include ``key`` (fit for the model and privacy keys, else simulate:
    a bad value stops either before anything runs)."""
    if key in cli.MODEL_KEYS + cli.PARTY_FLAGS + ("dp-seed",):
        return "fit"
    return "predict" if key == "predictions-path" else "simulate"


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES if (CHECKED[k].scope in RUN_SCOPES + ("party",))
                                       and not (CHECKED[k].type is str and v == 1) and k != "dp"
                                       and k not in cli.SET_BY_COMMAND])
def test_bad_command_line_value_exits_2_naming_the_option(key, value, capsys, monkeypatch):
    monkeypatch.setattr("flower_vfl.deploy.local.submit", lambda *a, **k: pytest.fail("Flower was called"))
    text = "nan" if isinstance(value, float) and math.isnan(value) else \
        "inf" if value == math.inf else str(value)
    with pytest.raises(SystemExit) as err:
        cli.main([_command_for(key), *(["--dp"] if _command_for(key) != "predict" else []), f"--{key}", text])
    assert err.value.code == 2
    assert f"--{key}" in capsys.readouterr().err


def test_run_config_refuses_party_horizontal_and_retired_keys():
    """A key the vertical run would not read is refused before any round, naming where it belongs."""
    with pytest.raises(ConfigError, match=re.escape("run config key 'dp-epsilon'=0.5 is refused: it is a party's own "
                                                    "privacy setting, read only from that party's node config")):
        parse_run_config({"dp-epsilon": 0.5})
    with pytest.raises(ConfigError, match=re.escape("run config key 'hz-iterations'=3 is refused: it belongs to the "
                                                    "horizontal app (flower_vfl.apps.horizontal)")):
        parse_run_config({"hz-iterations": 3})
    with pytest.raises(ConfigError, match=re.escape("run config key 'party-data-paths'='a.csv,b.csv' is refused: only "
                                                    "a party's own node config names its files; set 'data-path'")):
        parse_run_config({"party-data-paths": "a.csv,b.csv"})
    assert parse_run_config({"party-data-paths": ""}) == parse_run_config({})     # an old declared default
    with pytest.raises(ConfigError, match=re.escape("node config key 'dp-eps-bar'=1.0 is refused: it belongs to the "
                                                    "horizontal app")):
        parse_node_config({"partition-id": 0, "dp-eps-bar": 1.0}, {})
    # the party itself never reads the central node's privacy keys: ignored, not an error
    assert parse_node_config({"partition-id": 1}, {"dp-epsilon": 50.0})["dp-epsilon"] == SCHEMA["dp-epsilon"].default


HZ = [(k, v) for k, v in CASES if CHECKED[k].scope in ("hz-run", "hz-node")]


@pytest.mark.parametrize("key,value", HZ)
def test_the_horizontal_app_checks_its_keys(key, value):
    from flower_vfl.config.schema import parse_agent_node_config, parse_horizontal_run_config
    parse = parse_horizontal_run_config if SCHEMA[key].scope == "hz-run" else parse_agent_node_config
    source = "run config" if SCHEMA[key].scope == "hz-run" else "node config"
    with pytest.raises(ConfigError) as err:
        parse({key: value})
    assert str(err.value).startswith(f"{source} key {key!r}={value!r}")
    assert f"expected {SCHEMA[key].allowed()}" in str(err.value)


def test_the_horizontal_app_refuses_other_keys_and_its_defaults_are_the_codes():
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    from flower_vfl.config.schema import HZ_VARIANTS, parse_agent_node_config, parse_horizontal_run_config
    from flower_vfl.horizontal import VARIANTS
    assert HZ_VARIANTS == VARIANTS
    with pytest.raises(ConfigError, match=r"unknown run config key 'hz-iteration' \(did you mean 'hz-iterations'\?\)"):
        parse_horizontal_run_config({"hz-iteration": 3})
    with pytest.raises(ConfigError, match=r"run config key 'max-rounds'=3 is not read by the horizontal app's run config"):
        parse_horizontal_run_config({"max-rounds": 3})
    with pytest.raises(ConfigError, match=r"node config key 'dp-epsilon'=1.0 is not read by the horizontal agent's"):
        parse_agent_node_config({"dp-epsilon": 1.0})
    got = agent_privacy_from_node_config({})          # the agent's own defaults == the schema's
    assert (got["delta_bar"], got["sensitivity"], got["x_l1_max"], got["max_epsilon"], got["delta"]) == (
        SCHEMA["dp-delta-bar"].default, SCHEMA["dp-sensitivity"].default, SCHEMA["dp-x-l1-max"].default,
        SCHEMA["dp-max-epsilon"].default, SCHEMA["dp-delta"].default)
    assert got["eps_bar"] is None and SCHEMA["dp-eps-bar"].default == 0.0


def test_pyproject_and_readme_follow_the_schema():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    from flower_vfl.cli.app import app_pyproject
    from flower_vfl.config.schema import run_defaults
    assert declared == run_defaults()
    shipped = tomllib.loads(app_pyproject())["tool"]["flwr"]["app"]      # the app inside the package
    assert shipped["config"] == run_defaults()
    assert shipped["components"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "components"]
    page = (ROOT / "docs" / "config-keys.md").read_text()      # the key table (the README links to it)
    table = page.split("<!-- config-keys:start -->\n", 1)[1].split("\n<!-- config-keys:end -->", 1)[0]
    assert table == markdown_table()


def test_command_line_paths_reach_flower_absolute(tmp_path, monkeypatch):
    """The ServerApp and ClientApps run in Flower's processes, from another working directory: a
    relative --data-dir on the command line failed there ('a9a data file not found:
    ../shared/data/a9a/a9a'). Every path-valued key leaves the CLI absolute; '' stays ''."""
    import argparse

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(data_dir="../data/a9a", out_dir="runs/x", state_dir="", model_dir="~/m",
                              dataset="a9a", num_parties=2)
    rc = cli._run_config(args)
    assert rc["data-dir"] == str(tmp_path.parent / "data" / "a9a")
    assert rc["out-dir"] == str(tmp_path / "runs" / "x")
    assert rc["model-dir"] == str(Path.home() / "m")
    assert rc["state-dir"] == ""
    assert set(cli.PATH_KEYS) <= set(cli.RUN_DEFAULTS)


# ------------------------------------------------------------------ one table for the Python API and the environment
def test_every_flower_vfl_environment_variable_is_declared_in_the_schema():
    """The package reads no FLOWER_VFL_* variable the schema's ENVIRONMENT does not declare, and
    declares none it does not read."""
    from flower_vfl.config.schema import ENVIRONMENT
    pkg = Path(__file__).resolve().parents[1] / "flower_vfl"
    used = set()
    for path in pkg.rglob("*.py"):
        used |= set(re.findall(r"FLOWER_VFL_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    assert used == set(ENVIRONMENT), (f"undeclared: {sorted(used - set(ENVIRONMENT))}; "
                                      f"declared but unread: {sorted(set(ENVIRONMENT) - used)}")


def test_the_python_arguments_share_the_run_configs_declarations():
    """An argument that a config key sets is checked with that key's own declaration (type, range,
    default): the estimator's and the strategy's defaults are the run config's, and a value the run
    config refuses is refused as an argument too, naming the argument."""
    import inspect

    from flower_vfl import VerticalADMM
    from flower_vfl.config.schema import PARAMS, ParamError, check_param
    from flower_vfl.strategies.config import StrategyConfig

    for name, p in PARAMS.items():
        if p.config:
            assert p.key is SCHEMA[p.config], name
    cfg = StrategyConfig()
    for name, p in PARAMS.items():
        if p.config and hasattr(cfg, name) and not p.none:       # rho, state_dir, resume: None/'auto' = unset
            assert getattr(cfg, name) == p.key.default, name
    est = inspect.signature(VerticalADMM.__init__).parameters
    for name in ("lam", "alpha", "fit_intercept", "max_rounds", "tol", "variant", "acceleration", "x_solver",
                 "penalty", "loss", "tol_abs", "adaptive_rho", "l1_ratio"):
        assert est[name].default == PARAMS[name].key.default, name
    with pytest.raises(ParamError, match=re.escape(
            "VerticalADMM(max_rounds=2.7) is refused: expected an integer >= 1 and <= 1e+06 (ADMM rounds; run config "
            "key 'max-rounds'); pass max_rounds= such a value, e.g. the default max_rounds=50")):
        check_param("VerticalADMM", "max_rounds", 2.7)
    with pytest.raises(ConfigError, match=re.escape("run config key 'max-rounds'=2.7: expected an integer >= 1")):
        parse_run_config({"max-rounds": 2.7})
