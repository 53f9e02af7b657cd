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
