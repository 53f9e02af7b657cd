"""flower_vfl.deploy.local.wait_run asks Flower for the run's status (a `flwr ls` process, ~1 s of
CPU each) when the run's log stream ends, and while it is open only every STATUS_EVERY_S; once the
stream is gone it asks every `poll` s until the status is final."""

import io
import subprocess

from flower_vfl.deploy import local


class _Stream:
    """A `flwr log --stream` stand-in: its first `open_for` waits time out, the next one sees it end
    (`open_for=None`: ended from the start)."""

    def __init__(self, lines, open_for):
        self.stdout = io.StringIO("".join(line + "\n" for line in lines))
        self.pid, self.open_for, self.waits, self.ended = 4242, open_for or 0, [], open_for is None

    def poll(self):
        return 0 if self.ended else None

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if not self.ended and self.open_for > 0:
            self.open_for -= 1
            raise subprocess.TimeoutExpired("flwr log", timeout)
        self.ended = True
        return 0


def _run(monkeypatch, stream, statuses):
    asked = []
    monkeypatch.setattr(local.subprocess, "Popen", lambda *a, **k: stream)
    monkeypatch.setattr(local, "run_status", lambda *a, **k: asked.append(1) or {"status": statuses.pop(0)})
    monkeypatch.setattr(local.time, "sleep", lambda s: asked.append(("slept", s)))
    rec = local.wait_run("7", "loopback", {}, echo=io.StringIO(), timeout=3600, poll=2.0)
    return rec, asked


def test_status_is_asked_when_the_stream_ends_and_rarely_while_it_is_open(monkeypatch):
    stream = _Stream(["INFO : round 1", "INFO : done"], open_for=2)
    rec, asked = _run(monkeypatch, stream, ["running", "running", "finished:completed"])
    assert rec["status"] == "finished:completed" and rec["log_lines"] == ["INFO : round 1", "INFO : done"]
    assert asked == [1, 1, 1]                                   # two timeouts while open, one at its end
    assert stream.waits[:3] == [local.STATUS_EVERY_S, local.STATUS_EVERY_S, local.STATUS_EVERY_S]


def test_a_stream_that_ends_before_the_run_falls_back_to_polling(monkeypatch):
    stream = _Stream([], open_for=None)
    rec, asked = _run(monkeypatch, stream, ["running", "running", "finished:failed"])
    assert rec["status"] == "finished:failed"
    assert asked == [1, ("slept", 2.0), 1, ("slept", 2.0), 1]


def _flwr_env(tmp_path):
    env = local.loopback_env(tmp_path / "flwr_home")        # this interpreter's bin folder first
    (tmp_path / "flwr_home").mkdir()
    return env


def test_a_warm_flwr_answers_as_a_fresh_flwr_does(tmp_path):
    # the status read at the stream's end runs Flower's own CLI in a process started ahead
    env = _flwr_env(tmp_path)
    args = ["ls", "nosuch", "--run-id", "1"]
    local._flwr_json(args, env)                              # creates the default configuration
    fresh = local._flwr_json(args, env)
    warm = local.WarmFlwr.start(env)
    assert warm is not None
    assert warm.json(args) == fresh
    assert fresh["success"] is False and "SuperLink connection 'nosuch' not found" in fresh["error-message"]
    assert warm.proc.wait(timeout=30) is not None            # one command, then the process is gone


def test_no_warm_flwr_for_another_flwr_on_path_and_a_fresh_one_after_a_failure(tmp_path, monkeypatch):
    wrapper = tmp_path / "bin" / "flwr"                      # e.g. tests/_netns.py's wrapper on PATH
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\nexec ip netns exec x flwr \"$@\"\n")
    wrapper.chmod(0o755)
    assert local.WarmFlwr.start({"PATH": str(wrapper.parent)}) is None
    assert local.WarmFlwr.start({"PATH": str(tmp_path / "nothing")}) is None
    fresh = []
    monkeypatch.setattr(local, "_flwr_json", lambda args, env: fresh.append(args) or
                        {"success": True, "runs": [{"status": "finished:completed"}]})

    class Broken:
        def json(self, args, timeout=120):
            raise RuntimeError("warm `flwr ls` gave no JSON (exit 1)")
    assert local.run_status("7", "loopback", {}, Broken()) == {"status": "finished:completed"}
    assert fresh == [["ls", "loopback", "--run-id", "7"]]


def test_wait_run_hands_each_status_read_a_warm_flwr_started_before_it(monkeypatch):
    started, handed = [], []

    class Warm:
        closed = False

        @classmethod
        def start(cls, env):
            started.append(cls())
            return started[-1]

        def close(self):
            self.closed = True
    statuses = ["running", "finished:completed"]
    monkeypatch.setattr(local, "WarmFlwr", Warm)
    monkeypatch.setattr(local.subprocess, "Popen", lambda *a, **k: _Stream([], open_for=None))
    monkeypatch.setattr(local, "run_status", lambda run_id, conn, env, warm=None: handed.append(warm) or
                        {"status": statuses.pop(0)})
    monkeypatch.setattr(local.time, "sleep", lambda s: None)
    assert local.wait_run("7", "loopback", {}, echo=io.StringIO(), timeout=3600, poll=2.0)["status"] == \
        "finished:completed"
    assert handed == started and len(started) == 2         # one per read; none left over to close


def test_submit_never_gives_a_command_twice(tmp_path, monkeypatch):
    # the warm process may have submitted the run before it failed: no fresh `flwr run` after it
    fresh = []
    monkeypatch.setattr(local, "_flwr_json", lambda args, env, timeout=120: fresh.append(args) or
                        {"success": True, "run-id": 11})

    class Warm:
        def __init__(self, alive):
            self._alive = alive

        def alive(self):
            return self._alive

        def json(self, args, timeout=120):
            raise RuntimeError("warm `flwr run` gave no JSON (exit 1)")
    import pytest
    with pytest.raises(RuntimeError, match="warm `flwr run` gave no JSON"):
        local.submit(tmp_path, "loopback", "x=1", {}, warm=Warm(alive=True))
    assert fresh == []
    assert local.submit(tmp_path, "loopback", "x=1", {}, warm=Warm(alive=False)) == "11"   # died first
    assert fresh == [["run", str(tmp_path), "loopback", "--run-config", "x=1"]]
    env = _flwr_env(tmp_path)
    w = local.WarmFlwr.start(env)
    assert w.alive()
    w.close()
    assert not w.alive() and w.proc.returncode is not None
