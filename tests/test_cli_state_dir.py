"""Issue 22 item 5: a party's state folder is its node's own (required on a deployed SuperNode)
or the per-user default (in-process, the CLI, Flower's simulation), and the errors say which."""

from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.cli import main
from flower_vfl.privacy.store import StateDirRequired, default_state_dir

REQUIRED = ("this SuperNode's node config has no state-dir: a deployed party keeps its privacy ledger, PSI log "
            "and block cache in a folder of its own (the per-user default ~/.flower-vfl/party-state would be "
            "shared by every SuperNode of this account). Start the SuperNode with --node-config "
            "\"partition-id=<m> ... state-dir=/path/to/party-<m>-state\" (one folder per SuperNode, kept across "
            "runs), or set FLOWER_VFL_STATE_DIR for its process")
A9A = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a")
RC = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
    monkeypatch.delenv("FLOWER_VFL_STATE_DIR", raising=False)
    monkeypatch.delenv("FLOWER_VFL_NODE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def identify(node_config, rc=RC):
    c = Context(run_id=1, node_id=7, node_config=dict(node_config), state=RecordDict(), run_config=dict(rc))
    return ca.identify(Message(RecordDict({"config": ConfigRecord({"want": "party"})}), dst_node_id=7,
                               message_type="query.identify"), c)


@pytest.mark.parametrize("argv0", ["/venv/bin/flwr-clientapp", "/venv/bin/flower-supernode",
                                   "/site/flower_vfl/deploy/warm_exec.py"])
def test_a_deployed_party_without_state_dir_refuses_before_reading_anything(monkeypatch, tmp_path, argv0):
    monkeypatch.setattr("sys.argv", [argv0])
    for nc, rc in (({"partition-id": 1, "data-dir": A9A}, {**RC, "dataset": "a9a"}),   # its block cache
                   ({"partition-id": 1, "dp": True, "dp-epsilon": 1.0}, RC)):          # a private party's ledger
        with pytest.raises(StateDirRequired) as err:
            identify(nc, rc)
        assert str(err.value) == REQUIRED
    assert not (tmp_path / "home" / ".flower-vfl").exists()
    # its own folder: it starts, and keeps its state there
    reply = identify({"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "state-dir": str(tmp_path / "p1")})
    assert not reply.has_error() and reply.content["identity"]["private"] is True
    assert (tmp_path / "p1" / "party.sqlite").is_file()
    # the operator's explicit folder for the process is accepted too
    monkeypatch.setenv("FLOWER_VFL_STATE_DIR", str(tmp_path / "env"))
    assert default_state_dir() == tmp_path / "env"


def test_in_process_and_simulation_use_the_per_user_default(monkeypatch, tmp_path):
    for argv0 in ("/venv/bin/pytest", "/ray/_private/workers/default_worker.py", "/venv/bin/flower-vfl"):
        monkeypatch.setattr("sys.argv", [argv0])
        assert default_state_dir() == tmp_path / "home" / ".flower-vfl" / "party-state"


def test_deploy_local_gives_every_supernode_its_own_state_dir(monkeypatch, tmp_path):
    from _deploy_fakes import deploy_local_commands
    started = deploy_local_commands(monkeypatch, tmp_path, 3, node_configs={2: {"state-dir": "/srv/p2"}}, tls=False,
                                    auth=False)
    ncs = {m: started[f"node{m}"][started[f"node{m}"].index("--node-config") + 1] for m in range(3)}
    assert ncs[0] == f"partition-id=0 state-dir='{tmp_path.resolve() / 'state' / 'party0'}'"
    assert ncs[1] == f"partition-id=1 state-dir='{tmp_path.resolve() / 'state' / 'party1'}'"
    assert ncs[2] == "partition-id=2 state-dir='/srv/p2'"


def test_ledger_without_a_folder_says_it_read_the_per_user_default(capsys, tmp_path):
    assert main(["ledger"]) == 2
    home = tmp_path / "home" / ".flower-vfl" / "party-state"
    assert capsys.readouterr().err.strip() == (
        f"flower-vfl ledger: no party store at {home}, the per-user default of in-process runs and flower-vfl "
        "simulate (no private release was ever made there); a SuperNode's ledger is in its node config's "
        "state-dir: give --state-dir or --node-config")
    assert main(["ledger", "--state-dir", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"flower-vfl ledger: no party store at {tmp_path / 's'} (no private release was ever made there); "
        "give the party's --state-dir")
