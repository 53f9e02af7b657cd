"""A forked ClientApp that Flower's force exit ends says so (warm_exec.watch_force_exit).

Flower's ``flwr_exit`` runs the ClientApp's exit handlers, among them the push of its context, after
starting a thread that ends the process with ``os._exit`` 5 s later; at 10M rows that push did not
finish and the SuperNode later answered the next message with "ClientApp stopped responding"
(docs/benchmarks.md). In a forked child, with Flower's own ``flwr_exit`` (its timer shortened to
0.2 s) and an exit handler that outlasts it: the child ends with the exit code Flower gives, the
handler's end never comes, and the executor's log (the child's stdout) has the one ERROR line."""

import os
import sys

import pytest

from flower_vfl.deploy import warm_exec


def _child(handler_s: float, rec) -> None:
    try:
        import logging
        import time

        from flwr.supercore.logger import FLOWER_LOGGER
        for h in FLOWER_LOGGER.handlers:      # Flower's console handler to this process's fd 2 (the log)
            if isinstance(h, logging.StreamHandler):
                h.setStream(os.fdopen(os.dup(2), "w"))

        import flwr.supercore.exit.exit as fx
        import flwr.supernode.runtime.run_clientapp as rc
        from flwr.supercore.exit import add_exit_handler
        fx.FORCE_EXIT_TIMEOUT_SECONDS = 0.2
        fx.event = lambda *a, **k: None                  # no telemetry
        assert warm_exec.watch_force_exit(42, rec)
        add_exit_handler(lambda: (time.sleep(handler_s), print("handler done", flush=True)))
        rc.flwr_exit(code=0)
    except SystemExit as exc:
        os._exit(10 + (exc.code or 0))
    finally:
        os._exit(99)


def _run(capfd, handler_s, rec=None):
    capfd.readouterr()
    pid = os.fork()
    if pid == 0:
        _child(handler_s, rec)
    _, status = os.waitpid(pid, 0)
    got = capfd.readouterr()
    return os.waitstatus_to_exitcode(status), got.out + got.err


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork")
def test_a_force_exit_is_logged_once_and_keeps_flowers_exit_code(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(warm_exec.TIMING_ENV, str(tmp_path / "t.jsonl"))
    code, out = _run(capfd, 3.0, {"who": "party", "task": 42})
    assert code == 0                                     # Flower's os._exit(0): not our 99, not sys.exit's 10
    assert "handler done" not in out
    assert out.count("[warm_exec] task 42: Flower ended the ClientApp ") == 1
    assert "before its exit handlers were done" in out
    import json
    rec = json.loads((tmp_path / "t.jsonl").read_text())
    assert rec["task"] == 42 and rec["exit"] == 0 and "t_force_exit" in rec


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork")
def test_an_exit_within_the_timer_says_nothing(capfd):
    code, out = _run(capfd, 0.0)
    assert code == 10 and "handler done" in out and "Flower ended the ClientApp" not in out
