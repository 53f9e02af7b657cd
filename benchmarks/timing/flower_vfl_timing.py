"""Benchmark timing of the loopback deployment's processes, installed from outside the product.

``$FLOWER_VFL_TIMING`` names a file; every process of a deployment appends JSON lines of
timestamps to it: the central node's exchange (``who: server``, written by
``flower_vfl.strategies.exchange``), each SuperNode (``who: node``: its pulls and replies, its task
tokens, stalls of its process) and each ClientApp / ServerApp the warm executor forks
(``who: party`` / ``serverapp``: the fork, its handler call, the stages of Flower's
``run_clientapp`` / ``run_serverapp``, its heartbeats, its exit, its peak RSS).

The node and forked-task lines come from here, not from flower_vfl: :func:`enable` (called by a
benchmark before it starts the deployment) sets ``$FLOWER_VFL_TIMING`` and puts
``benchmarks/timing/`` first on ``$PYTHONPATH``, whose ``sitecustomize.py`` calls :func:`install`
in every Python process the deployment starts; :func:`install` adds observers to
``flower_vfl.deploy.hooks`` (``NODE_START``: :func:`time_node_loop`, after ``flower-vfl-supernode``'s
patches; ``FORK``: :func:`fork_observer`, in each forked task). What they replace in Flower is
listed in ``flower_vfl.flower_patches`` (``benchmark-timing``) and set through it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from flower_vfl.flower_patches import replace

#: the file the timing lines are appended to (one JSON object a line)
TIMING_ENV = "FLOWER_VFL_TIMING"
#: this folder: its sitecustomize.py installs the hooks in every process started with it on PYTHONPATH
SITE_DIR = Path(__file__).resolve().parent
CLIENT_RUNTIME, SERVER_RUNTIME = "flwr.supernode.runtime.run_clientapp", "flwr.superlink.runtime.run_serverapp"


def enable(path) -> None:
    """Timing lines to ``path`` from this process on and every process it starts (set before the
    deployment starts: ``$FLOWER_VFL_TIMING``, and ``$PYTHONPATH`` led by this folder)."""
    os.environ[TIMING_ENV] = str(path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *parts])


def install() -> bool:
    """In a process with ``$FLOWER_VFL_TIMING``: the node and fork observers added to
    ``flower_vfl.deploy.hooks`` (once). Returns whether timing is on."""
    if not os.environ.get(TIMING_ENV):
        return False
    from flower_vfl.deploy import hooks
    if time_node_loop not in hooks.NODE_START:
        hooks.NODE_START.append(time_node_loop)
    if fork_observer not in hooks.FORK:
        hooks.FORK.append(fork_observer)
    return True


def fork_observer(info: dict):
    """In a task the warm executor forked (``info``: who, task, pid, t_fork, modules_at_fork): the
    stages of Flower's ServerApp / ClientApp timed into one record; returns ``finish(code,
    force=False)``, which appends it as one line (``force``: Flower's force exit ended the child)."""
    rec = {k: v for k, v in info.items() if k != "modules_at_fork"}
    tops = info.get("modules_at_fork")
    if info.get("who") == "serverapp":
        _time_stages(rec, SERVER_RUNTIME, SERVER_STAGES)
    else:
        _time_clientapp_calls(rec)

    def finish(code, force=False):
        if force:
            _timing_line({**rec, "t_force_exit": time.time(), "t_exit": time.time(), "exit": code})
        else:
            _timing_line({**rec, "t_exit": time.time(), "exit": code}, tops)
    return finish


def time_node_loop() -> None:
    """Benchmarks ($FLOWER_VFL_TIMING): one JSON line per message this node pulled (``t_pull0``:
    the poll that found it began, ``t_pull1``: stored) and per reply it pushed (``t_reply0`` /
    ``t_reply1``: Flower's ``_push_messages``, which first waits for the ClientApp's reply)."""
    import json

    import flwr.supernode.start_client_internal as sci

    pull, push = getattr(sci, "_pull_and_store_message", None), getattr(sci, "_push_messages", None)
    if not callable(pull) or not callable(push):
        return

    def line(rec):
        try:
            with open(os.environ[TIMING_ENV], "a") as fh:
                fh.write(json.dumps({"who": "node", "pid": os.getpid(), **rec}) + "\n")
        except OSError:
            pass

    def _pull_and_store_message(*args, **kwargs):
        t0 = time.time()
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            line({"t_pull0": t0, "t_pull1": time.time()})
        return run_id

    def _push_messages(*args, **kwargs):
        t0 = time.time()
        try:
            return push(*args, **kwargs)
        finally:
            line({"t_reply0": t0, "t_reply1": time.time()})

    replace("benchmark-timing", sci, "_pull_and_store_message", _pull_and_store_message)
    replace("benchmark-timing", sci, "_push_messages", _push_messages)
    _time_task_tokens(line)


#: a stall of this node's process (all its threads, the Runtime API's event loop among them,
#: share one GIL) longer than this is written as a timing line
STALL_S = 0.5


def _time_task_tokens(line) -> None:
    """Benchmarks: the node state's task-token events (claim, activate, heartbeat acknowledged,
    finish, expiry), each with the token's ``active_until`` after it, and every stall of the
    process longer than :data:`STALL_S` (a thread that sleeps 0.1 s and notes how late it woke)."""
    import threading

    try:
        from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState as S
    except ImportError:
        return

    def until(self, task_id):
        rec = getattr(self, "task_token_store", {}).get(task_id)
        t = getattr(rec, "active_until", None)
        return t.timestamp() if t is not None else None

    def wrap(name):
        fn = getattr(S, name, None)
        if not callable(fn):
            return

        def timed(self, task_id, *a, **k):
            t0 = time.time()
            out = fn(self, task_id, *a, **k)
            line({"task_event": name, "task": task_id, "t": t0, "dt": time.time() - t0,
                  "ok": bool(out), "active_until": until(self, task_id)})
            return out
        replace("benchmark-timing", S, name, timed)
    for name in ("claim_task", "activate_task", "acknowledge_task_heartbeat", "finish_task"):
        wrap(name)
    expired = getattr(S, "_on_task_tokens_expired", None)
    if callable(expired):
        def _on_task_tokens_expired(self, tasks):
            line({"task_event": "expired", "t": time.time(), "tasks": [t.task_id for t in tasks],
                  "finished_at": [t.finished_at for t in tasks]})
            return expired(self, tasks)
        replace("benchmark-timing", S, "_on_task_tokens_expired", _on_task_tokens_expired)

    def watch():
        while True:
            t0 = time.monotonic()
            time.sleep(0.1)
            late = time.monotonic() - t0 - 0.1
            if late > STALL_S:
                line({"stall_s": round(late, 3), "t": time.time()})
    threading.Thread(target=watch, daemon=True, name="flower-vfl-stall-watch").start()


def _time_clientapp_calls(rec: dict) -> None:
    """In a forked child with $FLOWER_VFL_TIMING: note when the ClientApp's handler starts/ends."""
    import time

    from flwr.clientapp import ClientApp

    call = ClientApp.__call__

    def timed(self, *args, **kwargs):
        rec["t_call0"] = time.time()
        try:
            return call(self, *args, **kwargs)
        finally:
            rec["t_call1"] = time.time()

    replace("benchmark-timing", ClientApp, "__call__", timed)
    # the stages of Flower's run_clientapp (seconds spent in each, summed)
    import flwr.supernode.runtime.run_clientapp as rc

    rec["t_run"] = time.time()
    _time_stages(rec, CLIENT_RUNTIME, CLIENT_STAGES)
    # the Runtime API client's construction and the heartbeat thread's start
    client_cls, hb_cls = getattr(rc, "RuntimeHttpClient", None), getattr(rc, "HeartbeatSender", None)
    if isinstance(client_cls, type) and callable(getattr(client_cls, "from_server_address", None)):
        replace("benchmark-timing", rc, "RuntimeHttpClient", type("RuntimeHttpClient", (client_cls,), {
            "from_server_address": classmethod(lambda cls, *a, **k: _timed_stage(rec, "client", client_cls.from_server_address)(*a, **k))}))
    if isinstance(hb_cls, type) and callable(getattr(hb_cls, "start", None)):
        replace("benchmark-timing", rc, "HeartbeatSender", type("HeartbeatSender", (hb_cls,), {
            "start": lambda self: _timed_stage(rec, "heartbeat_start", hb_cls.start)(self),
            "stop": lambda self: _timed_stage(rec, "heartbeat_stop", hb_cls.stop)(self)}))
    load = getattr(rc, "get_load_client_app_fn", None)
    if callable(load):
        replace("benchmark-timing", rc, "get_load_client_app_fn",
                lambda *a, **k: _timed_stage(rec, "load_client_app", load(*a, **k)))
    _time_heartbeats_and_exit(rec, rc)


def _time_heartbeats_and_exit(rec: dict, rc) -> None:
    """In a forked child with $FLOWER_VFL_TIMING: each task heartbeat ([sent, answered, ok] in
    ``rec['hb']``) and when Flower's ``flwr_exit`` began (``t_flwr_exit``); a child that
    Flower's force exit ends (:func:`watch_force_exit`) writes its line then (``t_force_exit``)."""
    import time

    make_hb = getattr(rc, "make_task_heartbeat_fn_http", None)
    if callable(make_hb):
        def make_task_heartbeat_fn_http(*a, **k):
            fn = make_hb(*a, **k)

            def beat():
                t0, ok = time.time(), False
                try:
                    ok = fn()
                    return ok
                finally:
                    rec.setdefault("hb", []).append([round(t0, 3), round(time.time(), 3), bool(ok)])
            return beat
        replace("benchmark-timing", rc, "make_task_heartbeat_fn_http", make_task_heartbeat_fn_http)
    fexit = getattr(rc, "flwr_exit", None)
    if callable(fexit):
        def flwr_exit(*a, **k):
            rec["t_flwr_exit"] = time.time()
            return fexit(*a, **k)
        replace("benchmark-timing", rc, "flwr_exit", flwr_exit)


#: the stages of Flower's run_clientapp timed in a forked ClientApp with $FLOWER_VFL_TIMING
CLIENT_STAGES = ("pull_task_input", "install_from_fab", "push_message", "push_task_output", "event",
                 "start_parent_process_monitor", "cleanup_app_runtime_environment", "register_signal_handlers")
#: the stages of Flower's run_serverapp timed in a forked ServerApp with $FLOWER_VFL_TIMING
SERVER_STAGES = ("install_from_fab", "get_fab_metadata", "get_project_config", "get_fused_config_from_dir",
                 "run_", "flush_logs", "start_log_uploader", "stop_log_uploader", "event",
                 "start_parent_process_monitor", "cleanup_app_runtime_environment", "register_signal_handlers")


def _timed_stage(rec: dict, name: str, fn):
    """``fn`` wrapped to add the seconds each call takes to ``rec[name]`` and note when the first
    call began (``rec['t0_<name>']``)."""
    import time

    def wrapped(*args, **kwargs):
        t = time.time()
        rec.setdefault("t0_" + name, t)
        try:
            return fn(*args, **kwargs)
        finally:
            rec[name] = rec.get(name, 0.0) + time.time() - t
    return wrapped


def _time_stages(rec: dict, module: str, names) -> None:
    """In a forked child with $FLOWER_VFL_TIMING: each of ``names`` (functions looked up in
    ``module``) timed with :func:`_timed_stage`."""
    import importlib

    mod = importlib.import_module(module)
    for name in names:
        if callable(getattr(mod, name, None)):
            replace("benchmark-timing", mod, name, _timed_stage(rec, name, getattr(mod, name)))


def _timing_line(rec: dict, tops_at_fork=None) -> None:
    """Also the child's peak and current RSS (MB) and, with ``tops_at_fork``, the top-level
    modules it imported that the warm process had not."""
    import json
    try:
        with open("/proc/self/status") as fh:
            status = fh.read().splitlines()
        for key, name in (("VmHWM:", "peak_rss_mb"), ("VmRSS:", "rss_mb")):
            rec[name] = next(int(x.split()[1]) for x in status if x.startswith(key)) / 1024
    except (OSError, StopIteration, ValueError):
        pass
    if tops_at_fork is not None:
        rec["new_modules"] = sorted({m.split(".")[0] for m in sys.modules} - tops_at_fork)
    try:
        with open(os.environ[TIMING_ENV], "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    except OSError:
        pass
