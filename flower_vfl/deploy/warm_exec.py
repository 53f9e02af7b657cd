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
                "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "scipy.special", "threadpoolctl")


def _fork_executor():
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

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._forked: set[int] = set()      # pids of the children launch() forked

        def launch(self, spec):
            if spec.task_type != TaskType.CLIENT_APP or not hasattr(os, "fork"):
                return super().launch(spec)
            certificates = validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure)
            t0 = time.monotonic()
            pid = os.fork()
            if pid:
                self._forked.add(pid)
                return LaunchResult.accepted()
            code = 0
            # the app's code comes from the FAB, as in flwr-clientapp: forget this package (it
            # is imported here when started with ``python -m flower_vfl.deploy.warm_exec``)
            for name in [m for m in sys.modules if m == "flower_vfl" or m.startswith("flower_vfl.")]:
                del sys.modules[name]
            try:                                      # the child: what flwr-clientapp's main does
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
            super().reconcile()

    return ForkExecutor()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (its --port)")
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--root-certificates", default=None)
    ap.add_argument("--parent-pid", type=int, default=None)
    args = ap.parse_args(argv)
    import importlib
    for mod in WARM_IMPORTS:
        importlib.import_module(mod)
    import flwr.supercore.superexec.run_superexec as rs
    executor = _fork_executor()
    rs.get_executor = lambda *a, **k: executor     # the only change to Flower's loop
    rs.run_superexec(runtime_api_address=args.runtime_api_address, insecure=args.insecure,
                     root_certificates_path=args.root_certificates, parent_pid=args.parent_pid,
                     runtime_dependency_install=False)


if __name__ == "__main__":
    main()
