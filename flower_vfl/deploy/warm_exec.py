"""A warm SuperExec for a party's SuperNode run with ``--isolation process`` (flwr 1.41).

Flower's SuperExec starts a new ``flwr-clientapp`` interpreter for every message; on a 2-core
machine its start-up (interpreter, flwr, numpy/scipy imports) is most of a round on real nodes
(docs/benchmarks.md, "Latency of a round on real SuperNodes"). This runs Flower's own SuperExec
loop (``flwr.supercore.superexec.run_superexec``: the same task polling, the same Runtime API)
with one change: a ClientApp task runs in a child **forked** from this process, which has
already imported flwr and the third-party libraries, instead of a freshly exec'd interpreter.

What stays as in Flower: one process per message (module globals never survive a message;
state lives in ``context.state`` and on the party's disk); the ClientApp code is imported in
the child from the app bundle (FAB) Flower installed, as ``flwr-clientapp`` does; nothing of
``flower_vfl`` is imported here. Randomness: the child draws a private party's noise seed from
the OS at the time of the draw (``SeedSequence()``), so forked children share no noise state;
Python's ``random`` is reseeded in a forked child by CPython itself.

    flower-supernode --isolation process --port 9094 ...   # the party's SuperNode
    python -m flower_vfl.deploy.warm_exec --insecure --runtime-api-address 127.0.0.1:9094

Also (each checked against the Flower release, 1.41.x / 1.42.x; any other runs Flower's SuperExec
unpatched, with a warning): the SuperExec asks its SuperNode for the next task every 10 ms for 2 s
after a launch or a ClientApp's exit (then at Flower's interval); a forked ClientApp does not
extract and verify a FAB whose bytes it already installed; a ClientApp's pull of an object its
SuperNode does not hold yet is retried after 10 ms (Flower: 1 s); and opacus' accountants (torch)
are imported here once when installed, as a private party reports its ε by every accountant
(``--lean``: not).

Other task types (and non-POSIX systems) fall back to Flower's subprocess launch.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]

#: imported once here instead of in every ClientApp process (what flwr-clientapp and our
#: handlers import before any work; flower_vfl itself is imported in the child, from the FAB)
WARM_IMPORTS = ("flwr.supernode.runtime.run_clientapp", "flwr.clientapp", "flwr.app", "numpy",
                "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "scipy.special", "threadpoolctl",
                "dp_accounting", "dp_accounting.pld")
#: imported too when installed: a private party's reply reports its ε by every accountant, and
#: opacus' ('rdp', 'prv') import torch, ~3-4 s in every message's process otherwise
#: (``--lean`` skips them: less memory, slower private replies)
WARM_OPTIONAL = ("opacus.accountants",)
#: the Flower releases whose SuperExec loop this was read in (flwr/supercore/superexec/run_superexec.py)
PATCHED_FLWR = ("1.41.", "1.42.")
FLOWER_TASK_SLEEP = "time.sleep(task_poll_interval)"
#: after a task was launched or a forked ClientApp ended, ask the SuperNode for the next task
#: every HOT_TASK_POLL_S for HOT_WINDOW_S seconds (the next round's message is near), then at
#: Flower's interval ($FLWR_SUPEREXEC_TASK_POLL_INTERVAL, default 1 s)
HOT_TASK_POLL_S, HOT_WINDOW_S = 0.01, 2.0
#: benchmarks only: a file each forked ClientApp appends one JSON line of timings to
TIMING_ENV = "FLOWER_VFL_TIMING"


class _HotTime:
    """The ``time`` module as seen by Flower's SuperExec loop: its poll sleep is
    :data:`HOT_TASK_POLL_S` within :data:`HOT_WINDOW_S` after :meth:`active`."""

    def __init__(self):
        import math
        import time
        self._time, self.last = time, -math.inf

    def __getattr__(self, name):
        return getattr(self._time, name)

    def active(self) -> None:
        self.last = self._time.monotonic()

    def sleep(self, seconds):
        hot = self._time.monotonic() - self.last < HOT_WINDOW_S
        self._time.sleep(min(seconds, HOT_TASK_POLL_S) if hot else seconds)


def _reuse_installed_fabs() -> None:
    """In a forked child: a FAB whose bytes (SHA-256) this node's ClientApps already installed is
    not extracted and hash-verified again (Flower does both for every message, then finds the app
    installed and keeps it). The note is written after Flower's own install of those bytes succeeded,
    in ``$FLWR_HOME/apps/.flower-vfl-installed/<sha256>`` (the party's own disk)."""
    import hashlib
    from pathlib import Path

    import flwr.supernode.runtime.run_clientapp as rc
    from flwr.common.constant import APP_DIR
    from flwr.supercore.utils import get_flwr_home

    install = rc.install_from_fab

    def install_from_fab(fab_file, install_dir=None, skip_prompt=False):
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir, skip_prompt)
        note = get_flwr_home() / APP_DIR / ".flower-vfl-installed" / hashlib.sha256(fab_file).hexdigest()
        try:
            path = Path(note.read_text())
            if (path / "pyproject.toml").is_file():
                return path
        except OSError:
            pass
        path = install(fab_file, install_dir, skip_prompt)
        try:
            note.parent.mkdir(parents=True, exist_ok=True)
            tmp = note.with_name(f"{note.name}.{os.getpid()}")
            tmp.write_text(str(path))
            os.replace(tmp, note)
        except OSError:
            pass
        return path

    rc.install_from_fab = install_from_fab


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

    ClientApp.__call__ = timed
    # the stages of Flower's run_clientapp (seconds spent in each, summed)
    import flwr.supernode.runtime.run_clientapp as rc

    def stage(name, fn):
        def wrapped(*args, **kwargs):
            t = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                rec[name] = rec.get(name, 0.0) + time.time() - t
        return wrapped

    for name in ("pull_task_input", "install_from_fab", "push_message", "push_task_output", "event",
                 "start_parent_process_monitor", "cleanup_app_runtime_environment", "register_signal_handlers"):
        if callable(getattr(rc, name, None)):
            setattr(rc, name, stage(name, getattr(rc, name)))
    load = getattr(rc, "get_load_client_app_fn", None)
    if callable(load):
        rc.get_load_client_app_fn = lambda *a, **k: stage("load_client_app", load(*a, **k))


def _timing_line(rec: dict) -> None:
    import json
    try:
        with open(os.environ[TIMING_ENV], "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    except OSError:
        pass


def _fork_executor(clock=None):
    import time
    from logging import INFO

    from flwr.supercore import log
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import LaunchResult
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    class ForkExecutor(SubprocessExecutor):
        """ClientApp tasks in a forked child of this warm process; the rest as Flower does."""

        def __init__(self, *args, clock=None, **kwargs):
            super().__init__(*args, **kwargs)
            self._forked: set[int] = set()      # pids of the children launch() forked
            self._clock = clock                 # the loop's _HotTime: a launch / an exit -> hot

        def launch(self, spec):
            if spec.task_type != TaskType.CLIENT_APP or not hasattr(os, "fork"):
                return super().launch(spec)
            certificates = validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure)
            t0, t_fork = time.monotonic(), time.time()
            if self._clock is not None:
                self._clock.active()
            pid = os.fork()
            if pid:
                self._forked.add(pid)
                return LaunchResult.accepted()
            code = 0
            timing = {"who": "party", "task": spec.task_id, "pid": os.getpid(), "t_fork": t_fork} \
                if os.environ.get(TIMING_ENV) else None
            # the app's code comes from the FAB, as in flwr-clientapp: forget this package (it
            # is imported here when started with ``python -m flower_vfl.deploy.warm_exec``)
            for name in [m for m in sys.modules if m == "flower_vfl" or m.startswith("flower_vfl.")]:
                del sys.modules[name]
            try:                                      # the child: what flwr-clientapp's main does
                _reuse_installed_fabs()
                if timing is not None:
                    _time_clientapp_calls(timing)
                run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token,
                              insecure=spec.insecure, certificates=certificates, parent_pid=spec.parent_pid,
                              runtime_dependency_install=spec.runtime_dependency_install)
            except SystemExit as exc:                 # flwr_exit ends the task with sys.exit
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:                     # noqa: BLE001 - never return into the parent's loop
                code = 1
            finally:
                try:
                    log(INFO, "[warm_exec] task %d: forked ClientApp and its exit handlers done in %.3f s "
                        "(exit %s)", spec.task_id, time.monotonic() - t0, code)
                    if timing is not None:
                        _timing_line({**timing, "t_exit": time.time(), "exit": code})
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)

        def reconcile(self) -> None:
            """Reap the finished children this executor forked (no zombies; the processes
            Flower's own launch started are left to its Popen bookkeeping), then Flower's."""
            for pid in list(self._forked):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self._forked.discard(pid)
                    if self._clock is not None:
                        self._clock.active()
            super().reconcile()

    return ForkExecutor(clock=clock)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (its --port)")
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--root-certificates", default=None)
    ap.add_argument("--parent-pid", type=int, default=None)
    ap.add_argument("--lean", action="store_true",
                    help=f"do not pre-import {', '.join(WARM_OPTIONAL)} (torch): less memory, ~3-4 s more "
                         "per private party's message")
    args = ap.parse_args(argv)
    import importlib
    import importlib.util
    import inspect
    import warnings

    import flwr
    import flwr.supercore.superexec.run_superexec as rs

    version = getattr(flwr, "__version__", "?")
    if not version.startswith(PATCHED_FLWR) or FLOWER_TASK_SLEEP not in inspect.getsource(rs) \
            or not callable(getattr(rs, "get_executor", None)):
        warnings.warn(f"flower_vfl.deploy.warm_exec: flwr {version} is not a release this was read in "
                      f"({', '.join(v + 'x' for v in PATCHED_FLWR)}) or its SuperExec loop changed; running "
                      "Flower's SuperExec unpatched (a new flwr-clientapp process per message)", stacklevel=1)
    else:
        for mod in WARM_IMPORTS:
            importlib.import_module(mod)
        if not args.lean:
            for mod in WARM_OPTIONAL:
                if importlib.util.find_spec(mod.split(".")[0]) is not None:
                    importlib.import_module(mod)
        from flower_vfl.deploy.supernode import fast_object_retries
        fast_object_retries()            # inherited by every forked ClientApp: its pulls from its node
        clock = _HotTime()
        executor = _fork_executor(clock)
        rs.get_executor = lambda *a, **k: executor     # the ClientApp launch
        rs.time = clock                                # the task poll: hot after a launch / an exit
    rs.run_superexec(runtime_api_address=args.runtime_api_address, insecure=args.insecure,
                     root_certificates_path=args.root_certificates, parent_pid=args.parent_pid,
                     runtime_dependency_install=False)


if __name__ == "__main__":
    main()
