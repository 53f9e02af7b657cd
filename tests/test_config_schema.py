"""Every configuration key, through the run config (ServerApp start), a SuperNode's node config
and the command line: a wrong type, an out-of-range value, an unknown key, a missing
partition-id each stop the run before any round with an error naming the key and what is
allowed. The README's key table is the schema's."""

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


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES if CHECKED[k].scope != "node"])
def test_bad_run_config_stops_the_server_app_before_any_message(key, value):
    spec = SCHEMA[key]
    rc = {"dataset": "breast_cancer", key: value}
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(ConfigError) as err:
        sa.main(NoRounds({}, {}, rc), ctx)
    msg = str(err.value)
    assert msg.startswith(f"run config key {key!r}={value!r}")
    assert f"expected {spec.allowed()}" in msg


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES if CHECKED[k].scope != "run"])
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


@pytest.mark.parametrize("key,value", [(k, v) for k, v in CASES if CHECKED[k].scope != "node"
                                       and not (CHECKED[k].type is str and v == 1)])
def test_bad_command_line_value_exits_2_naming_the_option(key, value, capsys):
    if SCHEMA[key].type is bool and key == "dp":
        pytest.skip("--dp is a switch")
    text = "nan" if isinstance(value, float) and math.isnan(value) else \
        "inf" if value == math.inf else str(value)
    with pytest.raises(SystemExit) as err:
        cli.main(["fit", f"--{key}", text])
    assert err.value.code == 2
    assert f"--{key}" in capsys.readouterr().err


def test_pyproject_and_readme_follow_the_schema():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == {k: s.default for k, s in SCHEMA.items() if s.scope != "node"}
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- config-keys:start -->\n", 1)[1].split("\n<!-- config-keys:end -->", 1)[0]
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
