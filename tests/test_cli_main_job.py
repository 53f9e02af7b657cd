"""Issue 22 item 2: the README's main job (`flower-vfl simulate`) reports success only when it
succeeded, runs on a SuperLink of its own with no runtime dependency installation (Flower's
shared local SuperLink loses the run's status when it installs them, see
flower_vfl/deploy/local.py), and a failed run names the real error, not only Flower's status.
Every CLI call goes through the real entry point flower_vfl.cli:main."""

import json
import os
import re
from pathlib import Path

import pytest

from flower_vfl.cli import main
from flower_vfl.deploy import local

#: the log of a real failed run (Flower 1.42's simulation, Ray's node timing out under load),
#: abridged: the root cause comes first, then the exceptions it caused
RAY_LOG = """\
INFO :      Starting Flower Simulation
ERROR :     An exception occured!! The current node timed out during startup.
ERROR :     Traceback (most recent call last):
  File "/x/flwr/server/superlink/fleet/vce/vce_api.py", line 214, in run_api
    backend = backend_fn()
              ^^^^^^^^^^^^
Exception: The current node timed out during startup. This could happen because some of the raylet failed to startup.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/flwr/simulation/run_simulation.py", line 347, in _main_loop
    raise RuntimeError("An error was encountered. Ending simulation.") from ex
RuntimeError: An error was encountered. Ending simulation.
ERROR :     Exit Code: 700
""".splitlines()


def test_the_failure_message_names_the_root_cause_and_what_a_lost_heartbeat_means():
    rec = {"run-id": "7", "status": "finished:failed", "status-details": local.NO_HEARTBEAT, "log_lines": RAY_LOG,
           "log_path": "/tmp/x/run.log"}
    assert local.run_error(RAY_LOG) == [
        "Exception: The current node timed out during startup. This could happen because some of the raylet "
        "failed to startup.", "RuntimeError: An error was encountered. Ending simulation."]
    assert local.failure_message(rec) == (
        "run 7 finished:failed\n"
        "  error: Exception: The current node timed out during startup. This could happen because some of the "
        "raylet failed to startup.\n"
        "  then: RuntimeError: An error was encountered. Ending simulation.\n"
        "  Flower's status details: No heartbeat received from the task\n"
        "  (the process running the ServerApp ended, or was killed, without reporting to the SuperLink; Flower "
        "marks such a run failed 60 s after its last heartbeat. The error above is what its log shows)\n"
        "  full log: /tmp/x/run.log")


def test_a_one_line_user_error_in_the_log_is_the_error():
    lines = ["INFO :      round 1: train_loss=0.1",
             "ERROR :     ServerApp raised an exception: PartyFailed: node 5 failed the PSI answer step for split "
             "'train': DataError: x.csv: 3 duplicated ID(s)"]
    assert local.run_error(lines) == ["PartyFailed: node 5 failed the PSI answer step for split 'train': DataError: "
                                      "x.csv: 3 duplicated ID(s)"]


def test_the_job_superlink_is_its_own_without_runtime_installation(tmp_path, monkeypatch):
    """simulate's SuperLink: `flower-superlink --simulation` on a free port (not Flower's shared
    39091), its own FLWR_HOME, installation off by flag and by environment."""
    seen = {}

    def start(self, name, cmd, env=None, cwd=None):
        seen.update(cmd=[str(c) for c in cmd], env=env)
        raise RuntimeError("stop here")
    monkeypatch.setattr(local.Processes, "start", start)
    with pytest.raises(RuntimeError, match="stop here"):
        with local.simulation_superlink(tmp_path, {"FLOWER_VFL_NODE_CONFIG": "/n.json"}):
            pass
    cmd = seen["cmd"]
    assert cmd[:5] == ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess"]
    assert "--disable-runtime-dependency-installation" in cmd
    port = cmd[cmd.index("--port") + 1]
    assert port not in ("39091", "8000")
    assert seen["env"]["FLWR_HOME"] == str(tmp_path / "flwr_home")
    assert seen["env"]["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert seen["env"]["FLOWER_VFL_NODE_CONFIG"] == "/n.json"
    assert (tmp_path / "flwr_home" / "config.toml").read_text() == (
        f'[superlink]\ndefault = "flower-vfl-simulation"\n\n[superlink.flower-vfl-simulation]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n')


class FakeLink:
    """simulation_superlink without processes: records the environment it would run with."""
    made = []

    def __init__(self, workdir, env_extra=None, command="simulate"):
        self.workdir, self.env = Path(workdir), dict(os.environ, **(env_extra or {}))
        self.connection = "fake"
        FakeLink.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _fake_flower(monkeypatch, tmp_path, record):
    FakeLink.made = []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLOWER_VFL_APP_DIR", str(tmp_path / "app"))
    monkeypatch.setattr(local, "simulation_superlink", FakeLink)
    nodes = {}

    def submit(app, conn, run_config, env, federation_config=None):
        nodes["file"] = env["FLOWER_VFL_NODE_CONFIG"]
        nodes["content"] = json.loads(Path(nodes["file"]).read_text())
        return "42"
    monkeypatch.setattr(local, "submit", submit)
    monkeypatch.setattr(local, "wait_run", lambda *a, **k: dict(record))
    return nodes


def test_simulate_keeps_the_parties_node_configs_in_its_own_folder_not_the_home(tmp_path, monkeypatch, capsys):
    """No ~/.flower-vfl/simulate-node-config.json shared by every run of the account: the job's
    own private folder, removed when the run completed."""
    nodes = _fake_flower(monkeypatch, tmp_path, {"status": "finished:completed"})
    assert main(["simulate", "--dp", "--dp-parties", "1", "--dp-epsilon", "2"]) == 0
    folder = Path(nodes["file"]).parent
    assert folder.name.startswith("flower-vfl-simulate-") and not folder.exists()
    assert nodes["content"]["1"]["dp-epsilon"] == 2.0 and nodes["content"]["1"]["dp"] is True
    assert not (tmp_path / "home" / ".flower-vfl").exists()
    assert "run 42: finished:completed" in capsys.readouterr().out


def test_simulate_that_fails_names_the_real_error_and_exits_1(tmp_path, monkeypatch, capsys):
    rec = {"run-id": "42", "status": "finished:failed", "status-details": local.NO_HEARTBEAT,
           "log_lines": ["INFO :      round 1: train_loss=0.1"] + RAY_LOG}        # after round 1: no new try
    nodes = _fake_flower(monkeypatch, tmp_path, rec)
    assert main(["simulate"]) == 1
    err = capsys.readouterr().err
    folder = Path(nodes["file"]).parent
    assert err == ("flower-vfl: error: run 42 finished:failed\n"
                   "  error: Exception: The current node timed out during startup. This could happen because some "
                   "of the raylet failed to startup.\n"
                   "  then: RuntimeError: An error was encountered. Ending simulation.\n"
                   "  Flower's status details: No heartbeat received from the task\n"
                   "  (the process running the ServerApp ended, or was killed, without reporting to the SuperLink; "
                   "Flower marks such a run failed 60 s after its last heartbeat. The error above is what its log "
                   f"shows)\n  (this job's folder, kept: {folder})\n")
    assert folder.is_dir()


def test_superlink_list_and_stop_only_recorded_process_groups(tmp_path, monkeypatch, capsys):
    """`flower-vfl superlink list/stop`: a SuperLink recorded in the registry is listed and
    stopped by its process group; a PID the registry does not hold is refused, naming it."""
    import subprocess
    import sys
    monkeypatch.setenv("FLOWER_VFL_RUNTIME_DIR", str(tmp_path / "registry"))
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(local.free_port()))   # nothing answers there
    assert main(["superlink", "list"]) == 0
    assert capsys.readouterr().out == f"no SuperLink started by flower-vfl is running (registry: {tmp_path / 'registry'})\n"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        local.record_superlink(proc, 4242, tmp_path / "home", "simulate", tmp_path / "sl.log")
        assert main(["superlink", "list"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"pid {proc.pid}  port 4242  simulate  since ")
        assert out.endswith(f"  FLWR_HOME {tmp_path / 'home'}  log {tmp_path / 'sl.log'}\n")
        with pytest.raises(SystemExit) as e:
            main(["superlink", "stop", str(proc.pid + 100000)])
        assert e.value.code == 2
        assert capsys.readouterr().err == (
            f"flower-vfl: error: no running SuperLink started by flower-vfl has pid {proc.pid + 100000} "
            f"(`flower-vfl superlink list` shows them; registry {tmp_path / 'registry'})\n")
        assert proc.poll() is None
        assert main(["superlink", "stop", str(proc.pid)]) == 0
        assert capsys.readouterr().out == f"stopped SuperLink pid {proc.pid} (port 4242, simulate)\n"
        assert proc.wait(timeout=20) is not None
        assert local.recorded_superlinks() == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_a_job_whose_ray_node_did_not_start_is_run_again_once_nothing_ran(tmp_path, monkeypatch, capsys):
    """Ray gives its node a fixed 30 s; on a loaded machine the simulation may fail before any
    ClientApp ran: simulate starts the job again, once, saying why in one line. After round 1 it does not."""
    import re
    _fake_flower(monkeypatch, tmp_path, {})
    ray_failed = {"run-id": "42", "status": "finished:failed", "status-details": "x", "log_lines": RAY_LOG}
    answers = [dict(ray_failed), {"status": "finished:completed", "log_lines": []}]
    monkeypatch.setattr(local, "wait_run", lambda *a, **k: answers.pop(0))
    assert main(["simulate"]) == 0
    assert re.fullmatch(r"run 42: Ray's node did not start within its 30 s \(load \d+\.\d\); starting the job again "
                        r"\(attempt 2 of 2\)\n", capsys.readouterr().err)
    assert len(FakeLink.made) == 2              # a fresh SuperLink for the second try
    late = dict(ray_failed, log_lines=["INFO :      round 1: train_loss=0.1"] + RAY_LOG)
    answers[:] = [late, {"status": "finished:completed"}]
    assert main(["simulate"]) == 1
    assert "starting the job again" not in capsys.readouterr().err
    answers[:] = [dict(ray_failed) for _ in range(2)] + [{"status": "finished:completed"}]
    assert main(["simulate"]) == 1
    assert capsys.readouterr().err.count("starting the job again") == 1
    assert len(answers) == 1                   # no third try


def test_the_streamed_log_folds_each_traceback_to_one_line(tmp_path):
    """Ray's start-up failure (the log above, ~20 lines of two chained tracebacks) is shown as the
    lines around it and one line naming the root cause, the last exception and the full log."""
    import io

    from flower_vfl.cli.job import FoldTracebacks
    out = io.StringIO()
    shown = FoldTracebacks(out, tmp_path / "run.log")
    for line in RAY_LOG + ["INFO :      after"]:
        shown.write(line)                     # as tqdm.write gives it: the line, then its end
        shown.write("\n")
    shown.close()
    assert out.getvalue().splitlines() == [
        "INFO :      Starting Flower Simulation",
        "ERROR :     An exception occured!! The current node timed out during startup.",
        "[traceback folded: Exception: The current node timed out during startup. This could happen because some of "
        "the raylet failed to startup. (then RuntimeError: An error was encountered. Ending simulation.); full log: "
        f"{tmp_path / 'run.log'}]",
        "ERROR :     Exit Code: 700",
        "INFO :      after"]
    assert shown.folded == 1
    worker = ["(ClientAppActor pid=5) Traceback (most recent call last):", '(ClientAppActor pid=5)   File "x.py", line 1',
              "(ClientAppActor pid=5)     y()", "(ClientAppActor pid=5) KeyError: 'y'",
              "\x1b[92mINFO \x1b[0m:      parties: 0 -> node 1"]
    out.truncate(0)
    out.seek(0)
    for line in worker:
        shown.write(line + "\n")
    shown.close()
    assert out.getvalue().splitlines() == [f"[traceback folded: KeyError: 'y'; full log: {tmp_path / 'run.log'}]",
                                           worker[-1]]


def test_simulate_says_where_its_output_goes_and_how_long_it_took(tmp_path, monkeypatch, capsys):
    from flower_vfl.cli.job import RAY_LOADED_MACHINE
    nodes = {}

    class Link(FakeLink):
        def __init__(self, workdir, env_extra=None, **kw):
            nodes["env"] = dict(env_extra or {})
            super().__init__(workdir, env_extra, **kw)
    _fake_flower(monkeypatch, tmp_path, {"status": "finished:completed"})
    monkeypatch.setattr(local, "simulation_superlink", Link)
    monkeypatch.setenv("RAY_health_check_timeout_ms", "5")            # the user's own setting is kept
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("output: this terminal only (the rounds and the final test metrics below); no files are written. "
                      "Give --out-dir DIR for report.json, metrics.csv, run.png and report.html")
    assert re.fullmatch(r"run 42: finished:completed in \d+ s", out[-2]) and out[-1] == "wrote no files (no --out-dir)"
    assert {k: v for k, v in nodes["env"].items() if k.startswith("RAY_")} == {
        k: v for k, v in RAY_LOADED_MACHINE.items() if k != "RAY_health_check_timeout_ms"}
    run = tmp_path / "run"
    run.mkdir()
    for name in ("report.json", "metrics.csv", "run.png", "report.html"):
        (run / name).write_text("x")          # what the ServerApp writes (faked here)
    assert main(["simulate", "--out-dir", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"output: {run} (report.json and metrics.csv every round; run.png and report.html at the end; "
                      f"the label owner's checkpoints in {run}/state)")
    assert out[-1] == f"wrote {run}/: report.json, metrics.csv, run.png, report.html"


def test_a_superlink_that_does_not_start_is_one_line(tmp_path, monkeypatch, capsys):
    class Dead(FakeLink):
        def __enter__(self):
            raise RuntimeError("flower-superlink did not answer on port 1 within 60 s; see /x/logs/superlink.log")
    _fake_flower(monkeypatch, tmp_path, {})
    monkeypatch.setattr(local, "simulation_superlink", Dead)
    assert main(["simulate"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "flower-vfl: error: flower-superlink did not answer on port 1 within 60 s; see /x/logs/superlink.log"
    assert err[1].startswith("  (this job's folder, kept: ") and len(err) == 2


def test_an_own_data_job_says_its_model_folder_before_and_after(tmp_path):
    """`simulate --labels ... --model-dir DIR` writes the trained model there: the first line says so
    (not 'no files are written') and the last names the files it wrote."""
    from flower_vfl.cli.job import output_note, written_note
    model = tmp_path / "own"
    first = output_note("", str(model))
    assert first == (f"output: the trained model in {model} (label-owner.npz, party-<m>.npz) and this terminal; "
                     "no report files. Give --out-dir DIR for report.json, metrics.csv, run.png and report.html")
    model.mkdir()
    for name in ("label-owner.npz", "party-0.npz", "party-1.npz"):
        (model / name).write_bytes(b"x")
    assert written_note("", str(model)) == f"wrote {model}/: label-owner.npz, party-0.npz, party-1.npz"
    assert written_note("", "") == ""
