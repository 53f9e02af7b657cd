"""Issue 22 item 6: ``flower-vfl simulate`` and ``deploy-local`` show the rounds as they happen
(a tqdm bar fed by the ServerApp's log lines, the lines themselves printed above it)."""

from flower_vfl.cli import main
from flower_vfl.deploy import local

LINES = ["INFO :      round 1: train_loss=0.115750, primal_residual=136, dual_residual=0.00814, parties=2",
         "INFO :      round 2: train_loss=0.090521, primal_residual=28.6, dual_residual=0.007, parties=2",
         "INFO :      final (round 2): test_loss=0.1017, test_accuracy=0.9441, 49.7 s"]


def _feed(echo, on_line, seen):
    """What wait_run does with each streamed line; ``seen`` records the bar after each line."""
    for line in LINES:
        echo.write(line + "\n")
        on_line(line)
        seen.append(on_line.bar.n)


def _bar(err: str) -> list[str]:
    return [s.strip() for s in err.replace("\r", "\n").splitlines() if s.startswith("rounds:")]


def test_deploy_local_shows_each_round_as_it_comes(monkeypatch, tmp_path, capsys):
    seen, got = [], {}

    def deploy_local(workdir, n, rc, node_configs=None, app_dir=".", echo=None, on_line=None, **kw):
        got["total"] = on_line.total
        _feed(echo, on_line, seen)
        return {"record": {"status": "finished:completed"}, "exit_code": 0, "run_id": "7", "out_dir": "o",
                "logs": "l"}
    monkeypatch.setattr(local, "deploy_local", deploy_local)
    assert main(["deploy-local", "--max-rounds", "6", "--workdir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert got["total"] == 6 and seen == [1, 2, 2]      # the bar moved with the lines, before the run ended
    assert out.splitlines()[:3] == LINES and "run 7: finished:completed" in out
    bar = _bar(err)
    assert "rounds: 1/6 |█▋        |" in bar[1] and bar[1].endswith("train_loss=0.1158, primal=136")
    assert bar[-1].startswith("rounds: 2/2 |██████████|") and "train_loss=0.09052, primal=28.6" in bar[-1]
    assert bar[-1].endswith(" s/round")


def test_simulate_shows_each_round_as_it_comes(monkeypatch, tmp_path, capsys):
    from tests.test_cli_main_job import FakeLink
    seen = []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(local, "simulation_superlink", FakeLink)
    monkeypatch.setattr(local, "submit", lambda *a, **k: "42")

    def wait_run(run_id, connection, env, log_path=None, echo=None, on_line=None, **kw):
        _feed(echo, on_line, seen)
        return {"status": "finished:completed"}
    monkeypatch.setattr(local, "wait_run", wait_run)
    assert main(["simulate", "--max-rounds", "4"]) == 0
    out, err = capsys.readouterr()
    assert seen == [1, 2, 2]
    assert [line for line in out.splitlines() if line.startswith("INFO")] == LINES
    bar = _bar(err)
    assert bar[0] == "rounds: 0/4 |          | 00:00" and bar[1].startswith("rounds: 1/4 |") and bar[-1].startswith("rounds: 2/2 |██████████|")


def test_deploy_local_takes_own_files_as_each_supernode_node_config(monkeypatch, tmp_path, capsys):
    """Item 7: ``flower-vfl deploy-local --labels ... --party ...``: each party's files go in its
    own SuperNode's node config (not the run config), the label owner's in the run config."""
    got = {}
    for name in ("owner.csv", "bank.csv"):
        (tmp_path / name).write_text("id,label,a\n1,0,1.0\n2,1,2.0\n" if name == "owner.csv" else "id,b\n1,3\n2,4\n")

    def deploy_local(workdir, n, rc, node_configs=None, app_dir=".", echo=None, on_line=None, **kw):
        got.update(n=n, rc=rc, nodes=node_configs)
        return {"record": {"status": "finished:completed"}, "exit_code": 0, "run_id": "7", "out_dir": "o",
                "logs": "l"}
    monkeypatch.setattr(local, "deploy_local", deploy_local)
    assert main(["deploy-local", "--labels", str(tmp_path / "owner.csv"), "--party", str(tmp_path / "bank.csv"),
                 "--psi-max-asked", "1.25", "--model-dir", str(tmp_path / "m"), "--workdir", str(tmp_path / "w")]) == 0
    assert got["n"] == 2
    assert got["rc"]["labels-path"] == str(tmp_path / "owner.csv") and got["rc"]["num-parties"] == 2
    assert "data-path" not in got["rc"]
    assert got["nodes"] == {
        0: {"data-path": str(tmp_path / "owner.csv"), "label-column": "label", "id-column": "id", "preprocess": "none",
            "psi-max-asked": 1.25, "model-dir": str(tmp_path / "m")},
        1: {"data-path": str(tmp_path / "bank.csv"), "id-column": "id", "preprocess": "none", "psi-max-asked": 1.25,
            "model-dir": str(tmp_path / "m")}}
