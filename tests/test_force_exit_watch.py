"""A forked ClientApp that Flower's force exit ends says so (warm_exec.watch_force_exit).

Flower's ``flwr_exit`` runs the ClientApp's exit handlers, among them the push of its context, after
starting a thread that ends the process with ``os._exit`` 5 s later; at 10M rows that push did not
finish and the SuperNode later answered the next message with "ClientApp stopped responding"
(docs/benchmarks.md). In a forked child, with Flower's own ``flwr_exit`` (its timer shortened to
0.2 s) and an exit handler that outlasts it: the child ends with the exit code Flower gives, the
handler's end never comes, and the executor's log (the child's stdout) has the one ERROR line."""

import os
import sys
from pathlib import Path

import pytest

from flower_vfl.deploy import warm_exec


def _child(handler_s: float, on_force_exit=()) -> None:
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
        assert warm_exec.watch_force_exit(42, on_force_exit)
        add_exit_handler(lambda: (time.sleep(handler_s), print("handler done", flush=True)))
        rc.flwr_exit(code=0)
    except SystemExit as exc:
        os._exit(10 + (exc.code or 0))
    finally:
        os._exit(99)


def _run(capfd, handler_s, on_force_exit=()):
    capfd.readouterr()
    pid = os.fork()
    if pid == 0:
        _child(handler_s, on_force_exit)
    _, status = os.waitpid(pid, 0)
    got = capfd.readouterr()
    return os.waitstatus_to_exitcode(status), got.out + got.err


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork")
def test_a_force_exit_is_logged_once_and_keeps_flowers_exit_code(tmp_path, capfd):
    import json

    def finish(code, force=False):          # an observer's (flower_vfl.deploy.hooks.FORK) end of the task
        with open(tmp_path / "t.jsonl", "a") as fh:
            fh.write(json.dumps({"code": code, "force": force}) + "\n")
    code, out = _run(capfd, 3.0, [finish])
    assert code == 0                                     # Flower's os._exit(0): not our 99, not sys.exit's 10
    assert "handler done" not in out
    assert out.count("[warm_exec] task 42: Flower ended the ClientApp ") == 1
    assert "before its exit handlers were done" in out
    assert [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()] == [{"code": 0, "force": True}]


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork")
def test_an_exit_within_the_timer_says_nothing(capfd):
    code, out = _run(capfd, 0.0)
    assert code == 10 and "handler done" in out and "Flower ended the ClientApp" not in out


TIMING_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "timing"


def test_benchmark_timing_is_installed_from_outside_only_when_asked(tmp_path):
    """benchmarks/timing/: enable() puts its sitecustomize first on PYTHONPATH, and a process started
    with it has the timing observers in flower_vfl.deploy.hooks; without $FLOWER_VFL_TIMING (and in
    the product) the lists are empty."""
    import subprocess

    probe = "import flower_vfl.deploy.hooks as h; print([f.__name__ for f in h.NODE_START + h.FORK])"
    env = dict(os.environ, PYTHONPATH=str(TIMING_DIR))
    env.pop("FLOWER_VFL_TIMING", None)
    off = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    on = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True, check=True,
                        timeout=120, env=dict(env, FLOWER_VFL_TIMING=str(tmp_path / "t.jsonl"))).stdout.split()
    assert off == ["[]"] and on == ["['time_node_loop',", "'fork_observer']"]
    from flower_vfl.deploy import hooks
    assert hooks.NODE_START == [] and hooks.FORK == []


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork")
def test_a_forked_tasks_timing_line_from_the_benchmark_observer(tmp_path, monkeypatch, capfd):
    """The benchmark's fork observer, in a forked child as the warm executor calls it: a ClientApp
    call is timed and finish(code) appends one line with the task's fields and its exit."""
    import json
    monkeypatch.syspath_prepend(str(TIMING_DIR))
    monkeypatch.setenv("FLOWER_VFL_TIMING", str(tmp_path / "t.jsonl"))
    import flower_vfl_timing
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            from flwr.app import Message, RecordDict
            from flwr.clientapp import ClientApp

            from flower_vfl.deploy.local_grid import LocalGrid
            finish = flower_vfl_timing.fork_observer({"who": "party", "task": 7, "pid": os.getpid(), "t_fork": 1.5,
                                                      "modules_at_fork": {m.split(".")[0] for m in sys.modules}})
            app = ClientApp()
            app.query("probe")(lambda msg, ctx: Message(RecordDict(), reply_to=msg))
            grid = LocalGrid({"query.probe": lambda m, c: app(m, c)}, {1: {}})
            grid.send_and_receive([grid.create_message(RecordDict(), "query.probe", 1, "")])
            finish(0)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rec, = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert (rec["who"], rec["task"], rec["pid"], rec["t_fork"], rec["exit"]) == ("party", 7, pid, 1.5, 0)
    assert rec["t_fork"] < rec["t_call0"] <= rec["t_call1"] <= rec["t_exit"] and rec["peak_rss_mb"] > 0
    assert "new_modules" in rec
