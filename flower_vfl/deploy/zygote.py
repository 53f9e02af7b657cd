"""One warm process that forks a loopback deployment's SuperNodes and warm executors.

Each party of ``flower-vfl deploy-local`` is two long-lived processes: flower-vfl's SuperNode
(Flower's ``flower-supernode``: flwr, httpx, grpc, cryptography, pydantic... ~105 MB PSS each) and
its warm executor (flwr, numpy, scipy: ~65 MB PSS, plus ~100 MB for each forked ClientApp while
it runs). Started as separate interpreters, every party holds its own copy of the same library
pages. Here one process imports them once (``gc.freeze()`` after, so that a collection in a
child does not write to the pages it shares) and **forks** every SuperNode and executor, each in a
session of its own (``os.setsid``: stopped by process group like any process started by
:class:`~flower_vfl.deploy.local.Processes`), its output in its own log file, its arguments
exactly those of the separate process it replaces; the pages of the imported libraries stay
shared by all of them until written.

The warm process is single-threaded when it forks (checked: a fork of a threaded process is
refused with the thread names, and the caller falls back to separate processes). It reads one
JSON request a line on stdin, ``{"kind": "node"|"exec", "argv": [...], "log": path}``, answers
``{"pid": N}`` (or ``{"error": ...}``) on stdout, and exits at end of input (its children live on
in their own sessions). Its client is :class:`flower_vfl.deploy.local.Zygote`.

    python -m flower_vfl.deploy.zygote          # then JSON lines on stdin
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

__all__ = ["PRELOAD", "main"]

#: what a SuperNode and a warm executor import before their first message (flower_vfl's own
#: modules for them, then Flower's SuperNode and SuperExec, then the executor's warm imports)
PRELOAD = ("flower_vfl.deploy.supernode", "flower_vfl.deploy.warm_exec", "flwr.supernode.cli",
           "flwr.supercore.superexec.run_superexec")


def _child(kind: str, argv: list[str], log: str) -> None:
    """In the forked child: a session of its own, its log as stdout/stderr, default signals, then
    the SuperNode's or the executor's main exactly as its own interpreter would run it."""
    code = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        if kind == "node":
            from flower_vfl.deploy.supernode import main
            sys.argv = ["flower-vfl-supernode", *argv]
        else:
            from flower_vfl.deploy import warm_exec
            from flower_vfl.deploy.warm_exec import main
            sys.argv = [warm_exec.__file__, *argv]     # as `python -m flower_vfl.deploy.warm_exec` (store.py)
        try:
            code = main(argv) or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:                # noqa: BLE001 - the child must never return into the zygote loop
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> int:
    import gc
    import importlib
    import threading

    from flower_vfl.deploy.warm_exec import blas_timeout_env
    blas_timeout_env()                   # before numpy loads OpenBLAS here (the executors are forked)
    for mod in PRELOAD:
        importlib.import_module(mod)
    from flower_vfl.deploy.warm_exec import WARM_IMPORTS
    for mod in WARM_IMPORTS:
        importlib.import_module(mod)
    from flower_vfl.deploy.supernode import telemetry_off_by_default
    telemetry_off_by_default()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # children are reaped by the kernel
    gc.collect()
    gc.freeze()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            kind, argv, log = req["kind"], list(req["argv"]), req["log"]
            if kind not in ("node", "exec"):
                raise ValueError(f"kind={kind!r}; expected 'node' or 'exec'")
            if threading.active_count() > 1:
                raise RuntimeError("the warm process has threads " +
                                   ", ".join(t.name for t in threading.enumerate()) + "; it forks only single-threaded")
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(kind, argv, log)
            ans = {"pid": pid}
        except Exception as exc:          # noqa: BLE001 - answered to the caller, which falls back
            ans = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
