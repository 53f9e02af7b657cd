"""deploy-local's warm process (flower_vfl/deploy/zygote.py): it forks SuperNodes and executors,
each in a session of its own with its own log, exactly the arguments of the separate process it
replaces; a fork it cannot make falls back to a separate interpreter, loudly."""

import os
import time

import pytest

from flower_vfl.deploy import local
from flower_vfl.deploy.local import Processes, Zygote, ZygoteError, any_alive, start_supernode


def _wait_text(path, text, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return path.read_text(errors="replace")
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path} within {timeout} s:\n"
                         f"{path.read_text(errors='replace')[-2000:] if path.is_file() else '(no file)'}")


def test_forked_processes_run_the_real_mains_in_their_own_sessions_and_stop_by_group(tmp_path):
    """A forked executor with a bad flag fails as its own interpreter would (argparse's exit 2
    message, in its own log); a forked SuperNode with a bad --idle-poll says so and exits; each
    fork leads its own session (pgid = sid = pid), stopped like any process of ``Processes``."""
    procs = Processes(tmp_path / "logs")
    try:
        z = Zygote(procs, dict(os.environ), tmp_path)
        bad_exec = z.start("exec-bad", "exec", ["--no-such-flag"])
        _wait_text(tmp_path / "logs" / "exec-bad.log",
                   "warm_exec.py: error: the following arguments are required: --runtime-api-address")
        bad_exec.wait(timeout=30)
        bad_node = z.start("node-bad", "node", ["--idle-poll", "0"])
        _wait_text(tmp_path / "logs" / "node-bad.log",
                   "flower-vfl-supernode: --idle-poll='0' is out of range; give seconds between 0.05 and 3.0")
        bad_node.wait(timeout=30)
        # a live one: an executor polling a Runtime API nobody serves (it retries): its own session
        live = z.start("exec-live", "exec", ["--insecure", "--runtime-api-address", f"127.0.0.1:{local.free_port()}"])
        time.sleep(1.0)
        assert live.poll() is None
        assert os.getpgid(live.pid) == live.pid and os.getsid(live.pid) == live.pid
        assert os.getpgid(live.pid) != os.getpgid(z.proc.pid)
        with pytest.raises(ZygoteError, match=r"kind='shell'; expected 'node' or 'exec'"):
            z.start("x", "shell", [])
    finally:
        procs.stop_all()
    assert any_alive(procs.started) == []


def test_a_fork_that_fails_falls_back_to_its_own_interpreter_with_a_warning(tmp_path):
    started = []

    class Procs:
        procs = {}

        def start(self, name, cmd, env=None, cwd=None):
            started.append((name, [str(c) for c in cmd]))
            self.procs[name] = None
            return type("P", (), {"pid": 1})()

        def stop(self, name, *a, **k):
            self.procs.pop(name)

    class Broken:
        def start(self, name, kind, argv):
            raise ZygoteError("the warm process exited (code 1)")

    with pytest.warns(UserWarning, match=r"deploy-local: node0 not forked from the warm process \(the warm process "
                                         r"exited \(code 1\)\); started as its own interpreter"):
        start_supernode(Procs(), "node0", "127.0.0.1:9", {"partition-id": 0}, {}, tmp_path, exec_name="exec0",
                        zygote=Broken())
    assert [n for n, _ in started] == ["node0", "exec0"]
    assert started[0][1][1:3] == ["-m", "flower_vfl.deploy.supernode"]
    assert started[1][1][1:3] == ["-m", "flower_vfl.deploy.warm_exec"]


def test_deploy_local_stretches_the_hot_poll_with_the_number_of_parties(monkeypatch, tmp_path):
    """Up to 2 parties every SuperNode keeps the 0.02 s hot poll; beyond, 0.02 x M/2 (at most 0.5 s),
    so the pulls the one SuperLink serves after a round stay ~100 a second whatever M."""
    from flower_vfl.deploy.local import hot_poll_for
    from flower_vfl.deploy.supernode import HOT_POLL_S
    assert [hot_poll_for(m) for m in (1, 2, 3, 4, 8, 16, 100)] == [HOT_POLL_S, HOT_POLL_S, 0.03, 0.04, 0.08, 0.16, 0.5]
    from _deploy_fakes import deploy_local_commands
    for m, want in ((2, "0.02"), (16, "0.16")):
        started = deploy_local_commands(monkeypatch, tmp_path / str(m), m, tls=False, auth=False)
        polls = {started[f"node{i}"][started[f"node{i}"].index("--hot-poll") + 1] for i in range(m)}
        assert polls == {want}
