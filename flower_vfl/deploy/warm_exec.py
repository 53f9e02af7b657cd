"""A warm SuperExec for a party's SuperNode run with ``--isolation process`` (flwr 1.41).

Flower's SuperExec starts a new ``flwr-clientapp`` interpreter for every message; on a 2-core
machine its start-up (interpreter, flwr, numpy/scipy imports) is most of a round on real nodes
(docs/benchmarks.md, "Latency of a round on real SuperNodes"). This runs Flower's own SuperExec
loop (``flwr.supercore.superexec.run_superexec``: the same task polling, the same Runtime API)
with one change: a ClientApp task runs in a child **forked** from this process, which has
already imported flwr and the third-party libraries, instead of a freshly exec'd interpreter.

What stays as in Flower: one process per message (module globals never survive a message;
state lives in ``context.state`` and on the party's disk); the ClientApp code comes from the app
bundle (FAB) Flower installed for the task, as in ``flwr-clientapp``. The bundle's modules a
finished message imported (those under its installed folder; or, when the bundle's ClientApp is
an installed package, as in the app folder ``flower-vfl`` ships, that package's modules) are
imported once here, in the warm process, so the next messages of that bundle are forked with
them (no handler ever runs here; module-level code only; ``--no-preload``: off). A child of
another bundle first drops every preloaded module (and ``sys.path`` entry) its own bundle would
not import. Randomness: the child draws a private
party's noise seed from the OS at the time of the draw (``SeedSequence()``); nothing of ours
draws from numpy's global RandomState or a generator made at import time, and a forked child
reseeds numpy's global RandomState from the OS anyway (Python's ``random`` is reseeded by
CPython), so forked children share no noise state.

The party's block (``flower_vfl.io.party_cache``): a finished ClientApp also reports the requests
its verified cached block served (dataset, party, number of parties, data and state folders, as the
child computed them from its node config and the run); this process then maps those blocks
(``preload_blocks``: only a block whose checksum is recorded as holding for its file's current stat,
nothing parsed, hashed or written), so the next children are forked with the block already mapped
and a child uses it only for the very request it computes itself, while the block file and the source
files keep the stat keys (device, inode, size, modification and change time) they had at the
verified read; else it reads and checks its block as before. ``FLOWER_VFL_WARM_BLOCKS=0``: off.

OpenBLAS's idle threads: a fork stops OpenBLAS's thread pool and each forked ClientApp starts it
again at its first BLAS thread change; with OpenBLAS's default its new worker then spins ~0.1 s of
a core before it sleeps, taking it from the handler on a busy machine. This executor sets
``OPENBLAS_THREAD_TIMEOUT`` (:data:`BLAS_THREAD_TIMEOUT`) before it loads numpy, unless it is set
(:func:`blas_timeout_env`): speed only, the thread count and every result are unchanged.

Flower's telemetry (an HTTP POST at every ClientApp's exit, waited for) is off in the processes
this starts unless ``FLWR_TELEMETRY_ENABLED`` is set (``FLWR_TELEMETRY_ENABLED=1``: on, as in
Flower); when off, its per-process look-ups are made once here instead of in every message.

    flower-supernode --isolation process --port 9094 ...   # the party's SuperNode
    python -m flower_vfl.deploy.warm_exec --insecure --runtime-api-address 127.0.0.1:9094

Also (each listed and checked against the Flower release in :mod:`flower_vfl.flower_patches`,
1.41.x / 1.42.x; any other runs Flower's SuperExec unpatched, with a warning naming the patch):
the SuperExec asks its SuperNode for the next task every 10 ms for 2 s
after a launch or a ClientApp's exit (then at Flower's interval), or, with ``--wake-port U``, waits
on UDP 127.0.0.1:U between polls instead (its SuperNode, ``flower-vfl-supernode --wake-executor U``,
sends a datagram when it stored a message; a poll every 1 s without one); a forked ClientApp does not
extract and verify a FAB whose bytes it already installed, and names those FABs when it pulls its task
input, so that its node (``flower-vfl-supernode``) sends the run's FAB without content when it is one
of them (:mod:`flower_vfl.deploy.installed_fab`); a ClientApp's pull of an object its
SuperNode does not hold yet is retried after 10 ms (Flower: 1 s).

Memory (``--accountants``): a private party's reply reports its ε by every accountant (opacus'
'rdp' and 'prv' import torch: ~3-4 s and ~235 MB), so opacus' accountants are imported here for a
private party only: ``auto`` (default) imports them here once a
forked ClientApp of this node imported them (its first private message; a non-private party's
executor never imports them), ``eager`` at start (``flower-vfl deploy-local`` passes it for a party
whose node config makes it private), ``off`` (or ``--lean``) never. Each forked child freezes the
objects it inherits out of Python's cyclic garbage collector (``gc.freeze()``) before anything
else, so a collection in the child does not write to, and copy, the pages it shares with this
process.

The same executor serves a SuperLink's ServerApps (``--app serverapp``, pointed at a SuperLink
started with ``--isolation process``; ``flower-vfl deploy-local`` does this): each run's ServerApp
is Flower's ``flwr-serverapp`` code (``run_serverapp``: its log upload, heartbeat and exit) in a
child forked from a process that imported flwr, numpy, scipy and matplotlib; ``--preload-package
flower_vfl.apps.server`` (or ``flower_vfl.apps.client`` for a party) imports the installed app at
start, so the first task is forked with it too (a bundle that ships its own copy drops it in its
child). In a forked ServerApp, Flower's ``flush_logs`` (a fixed 1 s sleep before the final status)
waits for its log uploader's last push instead (:func:`_drained_flush`).

    flower-superlink --isolation process --port 9093 ...
    python -m flower_vfl.deploy.warm_exec --app serverapp --preload-package flower_vfl.apps.server \
        --runtime-api-address 127.0.0.1:9093 --root-certificates ca.crt --parent-pid <superlink pid>

Other task types (and non-POSIX systems, or a Flower whose ServerApp process code differs:
:func:`serverapp_forkable`) fall back to Flower's subprocess launch.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading

from flower_vfl.deploy import hooks
# bound at import: a forked child drops this package's modules before Flower's code runs
from flower_vfl.deploy.installed_fab import InstalledFab, announce_installed_fabs, client_code_missing, note_dir
from flower_vfl.flower_patches import applicable, replace

__all__ = ["main"]

#: imported once here instead of in every ClientApp process (what flwr-clientapp and our
#: handlers import before any work; flower_vfl itself is imported in the child, from the FAB)
WARM_IMPORTS = ("flwr.supernode.runtime.run_clientapp", "flwr.clientapp", "flwr.app", "numpy",
                "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "scipy.special", "threadpoolctl",
                "dp_accounting", "dp_accounting.pld")
#: the same for a SuperLink's ServerApp tasks (``--app serverapp``): what flwr-serverapp and the
#: central node import before round 1, and matplotlib for its report's figure
SERVER_WARM_IMPORTS = ("flwr.superlink.runtime.run_serverapp", "flwr.serverapp", "flwr.app", "numpy",
                       "scipy.sparse", "scipy.linalg", "scipy.special", "threadpoolctl", "matplotlib",
                       "matplotlib.figure", "matplotlib.backends.backend_agg")
#: what only a private party's reply imports (it reports its ε by every accountant; opacus' 'rdp'
#: and 'prv' import torch, ~3-4 s and ~235 MB in every message's process otherwise): imported here
#: only for a private party (``--accountants``: ``auto`` once a forked ClientApp imported them,
#: ``eager`` at start, ``off`` never), when installed
WARM_PRIVATE = ("opacus.accountants",)
#: the previous name of :data:`WARM_PRIVATE`
WARM_OPTIONAL = WARM_PRIVATE
ACCOUNTANTS = ("auto", "eager", "off")
FLOWER_TASK_SLEEP = "time.sleep(task_poll_interval)"
#: after a task was launched or a forked ClientApp ended, ask the SuperNode for the next task
#: every HOT_TASK_POLL_S for HOT_WINDOW_S seconds (the next round's message is near), then at
#: Flower's interval ($FLWR_SUPEREXEC_TASK_POLL_INTERVAL, default 1 s)
HOT_TASK_POLL_S, HOT_WINDOW_S = 0.01, 2.0
#: with ``--wake-port`` (the node wakes the loop when it stored a message): the loop's fallback
#: poll, at least this many seconds (Flower's default interval)
WAKE_POLL_S = 1.0
#: the preloaded app's block cache (:func:`_report_bundle_modules` reports the blocks a child was
#: served from it; the warm process maps them: ``preload_blocks``), and the switch that turns that off
BLOCK_CACHE, WARM_BLOCKS_ENV = "flower_vfl.io.party_cache", "FLOWER_VFL_WARM_BLOCKS"


def warm_blocks_enabled(environ=None) -> bool:
    """False when ``$FLOWER_VFL_WARM_BLOCKS`` is 0/false/no/off."""
    env = os.environ if environ is None else environ
    return env.get(WARM_BLOCKS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


#: at most this many bundles' modules are kept imported in the warm process (oldest dropped)
MAX_PRELOADED_APPS = 4
#: OpenBLAS's idle worker threads spin 2^n cycles before they sleep (its default n = 28: ~0.1 s of a
#: core). A fork stops OpenBLAS's thread pool, so each forked ClientApp starts it again at its first
#: BLAS thread change (the x-update's one-thread context): with the default spin its new worker
#: took a core from the handler and from the push of its reply (a9a on real nodes, load 7-10, 7
#: alternated deployments: the party's handler 60 -> 45 ms, its process around it 330 -> 291 ms,
#: a round 0.740 -> 0.692 s; benchmarks/bench_real_nodes.py). Set for this process and its
#: children unless ``$OPENBLAS_THREAD_TIMEOUT`` is set (n = 4, OpenBLAS's smallest: 16 cycles)
BLAS_TIMEOUT_ENV, BLAS_THREAD_TIMEOUT = "OPENBLAS_THREAD_TIMEOUT", "4"


def _under(path, folder: str) -> bool:
    return isinstance(path, str) and (path == folder or path.startswith(folder.rstrip(os.sep) + os.sep))


def _bundle_modules(folder: str, tops=None) -> list[str]:
    """Names of the imported modules whose file lies in ``folder`` (an installed app bundle; with
    ``tops``, an installed package's root: only modules of those top-level packages)."""
    return [name for name, mod in list(sys.modules.items())
            if (tops is None or name.split(".")[0] in tops) and _under(getattr(mod, "__file__", None), folder)]


def _drop_bundle(folder: str, tops=None) -> None:
    """Forget a preloaded app in this process: its modules, and a bundle's ``sys.path`` entry."""
    for name in _bundle_modules(folder, tops):
        sys.modules.pop(name, None)
    if tops is None:
        sys.path[:] = [p for p in sys.path if p != folder]


def _shadowed(folder: str, tops, project_dir: str) -> bool:
    """Would a ClientApp loaded from ``project_dir`` import other code than the preloaded app in
    ``folder``? A bundle: unless it is that folder. An installed package (``tops``): when the
    bundle has a package or module of that name (Flower puts the bundle first on ``sys.path``)."""
    if tops is None:
        return folder != project_dir
    return folder != project_dir and any(
        os.path.exists(os.path.join(project_dir, t)) or os.path.exists(os.path.join(project_dir, t + ".py"))
        for t in tops)


class AppPreloader:
    """In the warm process: the apps whose modules are imported here, from what a finished
    ClientApp reported having imported: an installed bundle (folder -> None: every module under
    it) or, for a bundle whose code is an installed package (the app folder ``flower-vfl`` ships
    holds only its pyproject.toml), that package (its root on ``sys.path`` -> its top-level names)."""

    def __init__(self, limit: int = MAX_PRELOADED_APPS):
        self.apps: dict[str, frozenset | None] = {}
        self.failed: set[str] = set()
        self.limit = limit

    def preload(self, folder: str, names, tops=None) -> int:
        """Import ``names`` here (modules of the bundle installed in ``folder``, or with ``tops`` of
        the installed package under the ``sys.path`` root ``folder``); returns how many of its
        modules are new here. An app whose top-level packages another preloaded app also has
        replaces it; an import error, or a module found elsewhere, drops it (the children import it
        themselves, as in Flower)."""
        import importlib
        import warnings

        folder = os.path.abspath(folder)
        tops = None if tops is None else frozenset(tops)
        names = [n for n in names if isinstance(n, str) and n and (tops is None or n.split(".")[0] in tops)]
        if folder in self.failed or not names or not os.path.isdir(folder) or \
                (tops is None and not os.path.isfile(os.path.join(folder, "pyproject.toml"))):
            return 0
        mine = {n.split(".")[0] for n in names}
        for other, other_tops in [(f, t) for f, t in self.apps.items() if f != folder]:
            if mine & {n.split(".")[0] for n in _bundle_modules(other, other_tops)}:
                _drop_bundle(other, other_tops)
                del self.apps[other]
        # other copies of those packages (e.g. this package as started, when the app is a bundle)
        for name in [m for m in sys.modules if m.split(".")[0] in mine
                     and not _under(getattr(sys.modules[m], "__file__", None), folder)]:
            del sys.modules[name]
        if tops is None and folder not in sys.path:
            sys.path.insert(0, folder)
        new = [n for n in sorted(set(names), key=lambda n: (n.count("."), n)) if n not in sys.modules]
        before = set(_bundle_modules(folder, tops))
        try:
            for name in new:
                importlib.import_module(name)
            elsewhere = [n for n in new if not _under(getattr(sys.modules.get(n), "__file__", None), folder)]
            if elsewhere:
                raise ImportError(f"{elsewhere[0]} was found outside {folder}")
        except BaseException as exc:                  # noqa: BLE001 - the warm loop must go on
            warnings.warn(f"flower_vfl.deploy.warm_exec: importing the app in {folder} failed "
                          f"({type(exc).__name__}: {exc}); its messages import it themselves", stacklevel=1)
            _drop_bundle(folder, tops)
            for name in [m for m in sys.modules if m.split(".")[0] in mine]:
                del sys.modules[name]
            self.apps.pop(folder, None)
            self.failed.add(folder)
            return 0
        self.apps[folder] = tops
        while len(self.apps) > self.limit:
            oldest = next(iter(self.apps))
            _drop_bundle(oldest, self.apps.pop(oldest))
        _warm_caches()
        return len(set(_bundle_modules(folder, tops)) - before)


#: process-wide caches of the preloaded package that every forked child would otherwise build
#: again: (module, function) called once here after a preload
WARM_CACHES = (("flower_vfl.core.blas", "one_blas_thread"),)


def _warm_caches() -> None:
    """Build here, once, what each forked child would build for itself: the BLAS thread
    controller of ``flower_vfl.core.blas`` (threadpoolctl scans every loaded library: 13.8 ms
    in each forked child of a cold warm process, 0.05 ms when built before the fork; the
    libraries' handles stay valid in the child, which maps the same ones)."""
    for module, name in WARM_CACHES:
        fn = getattr(sys.modules.get(module), name, None)
        if callable(fn):
            try:
                fn()
            except Exception:                   # noqa: BLE001 - a cache only: the child builds it
                pass


def _silence_output():
    """In a forked child: file descriptors 1 and 2 to /dev/null (what Flower's subprocess launch does
    with ``suppress_output``); returns copies of the old ones for :func:`_restore_output`."""
    sys.stdout.flush()
    sys.stderr.flush()
    kept = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return kept


def _restore_output(kept) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os.dup2(kept[0], 1)
    os.dup2(kept[1], 2)


def _child_after_fork(preloaded) -> None:
    """In a forked child, before Flower's ClientApp code: the objects inherited from the warm
    process frozen out of the cyclic garbage collector (a collection here would write to their
    headers and copy the pages this child shares with the warm process: ~95 MB of a child forked
    from a process that imported torch, ~2 MB frozen); numpy's global RandomState from fresh OS
    entropy (nothing of ours draws from it; no two children share it anyway); no ``flower_vfl``
    module but a preloaded app's (``preloaded``: folder -> tops, :class:`AppPreloader`)."""
    import gc
    gc.freeze()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()                                  # None: OS entropy
    ours = [m for m in sys.modules if m == "flower_vfl" or m.startswith("flower_vfl.")]
    if not ours:
        return
    keep = set().union(*(_bundle_modules(f, t) for f, t in preloaded.items()))   # one pass per app
    for name in ours:
        if name not in keep:
            del sys.modules[name]


#: where Flower's ClientApp / ServerApp process looks up ``load_app`` (patched in a forked child
#: to learn the bundle's folder) and ``install_from_fab`` (:func:`_reuse_installed_fabs`)
CLIENT_LOADER, SERVER_LOADER = "flwr.clientapp.utils", "flwr.server.run_serverapp"
CLIENT_RUNTIME, SERVER_RUNTIME = "flwr.supernode.runtime.run_clientapp", "flwr.superlink.runtime.run_serverapp"


def _run_serverapp(spec, certificates) -> None:
    """In a forked child: what ``flwr-serverapp``'s main (flwr 1.41/1.42,
    ``flwr.superlink.cli.flwr_serverapp``) does after parsing its arguments: the process's output
    mirrored to the queue Flower's log uploader sends to the SuperLink, then Flower's
    ``run_serverapp`` for the task's token (it ends with ``flwr_exit``: ``SystemExit``).

    One change (:func:`patch_serverapp_flush`, :func:`_drained_flush`): at the end, Flower's ``flush_logs`` waits until the log
    queue is empty and then sleeps 1 s "to allow the PushLogs call to complete" before the run's
    final status is pushed; here it waits until the uploader thread has come back to the queue twice
    after it was empty (each visit follows its previous push: 0.2-0.4 s), at most that 1 s."""
    from flwr.supercore.logger import mirror_output_to_queue, restore_output
    from flwr.superlink.runtime import run_serverapp

    log_queue = _DrainQueue()
    mirror_output_to_queue(log_queue)
    try:
        run_serverapp(runtime_api_address=spec.runtime_api_address, log_queue=log_queue, token=spec.token,
                      insecure=spec.insecure, certificates=certificates, parent_pid=spec.parent_pid,
                      runtime_dependency_install=spec.runtime_dependency_install)
    finally:
        restore_output()


_FORKABLE: list = []


def serverapp_forkable() -> bool:
    """Does this Flower have what a forked ServerApp calls (flwr-serverapp's code as read in 1.42:
    ``flwr.superlink.runtime.run_serverapp``, the ``load_app`` of ``flwr.server.run_serverapp``, the
    output mirroring of ``flwr.supercore.logger``)? If not, ServerApp tasks are launched as Flower
    does (a new ``flwr-serverapp``), with one warning."""
    if not _FORKABLE:
        import importlib
        try:
            rt, srv, lg = (importlib.import_module(m) for m in
                           (SERVER_RUNTIME, SERVER_LOADER, "flwr.supercore.logger"))
            missing = [f"{m.__name__}.{n}" for m, n in (
                (rt, "run_serverapp"), (rt, "install_from_fab"), (srv, "load_app"),
                (lg, "mirror_output_to_queue"), (lg, "restore_output")) if not callable(getattr(m, n, None))]
        except ImportError:
            missing = [SERVER_RUNTIME]
        _FORKABLE.append(applicable("serverapp-fork", missing, stacklevel=3))
    return _FORKABLE[0]


#: what Flower's flush_logs (flwr.supercore.logger, 1.41/1.42) ends with: the 1 s it sleeps after
#: the log queue is empty, which :func:`_drained_flush` replaces
FLOWER_FLUSH_SLEEP = "time.sleep(min(1, remaining))"


def patch_serverapp_flush() -> bool:
    """In a forked ServerApp (before anything wraps it): Flower's ``flush_logs`` as
    ``run_serverapp`` calls it replaced by :func:`_drained_flush`, when it is the one this was read
    in; returns whether it was."""
    import importlib
    rt = importlib.import_module(SERVER_RUNTIME)
    if not applicable("serverapp-flush", [] if _is_flowers_flush(getattr(rt, "flush_logs", None))
                      else [f"flush_logs ending in {FLOWER_FLUSH_SLEEP}"]):
        return False
    replace("serverapp-flush", rt, "flush_logs", _drained_flush)
    return True


def _is_flowers_flush(fn) -> bool:
    """``fn`` is the ``flush_logs`` of the Flower release this was read in (its queue wait, then its
    fixed 1 s sleep); otherwise it is kept."""
    import inspect
    try:
        return callable(fn) and getattr(fn, "__module__", "") == "flwr.supercore.logger" \
            and FLOWER_FLUSH_SLEEP in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


class _DrainQueue(queue.Queue):
    """The forked ServerApp's log queue: counts the uploader's visits that found it empty (Flower's
    ``_log_uploader`` takes everything with ``get_nowait`` until ``Empty``, pushes it, sleeps 0.2 s,
    comes back)."""

    def __init__(self):
        super().__init__()
        self.drains = 0
        self.drained = threading.Condition()

    def get_nowait(self):
        try:
            return super().get_nowait()
        except queue.Empty:
            with self.drained:
                self.drains += 1
                self.drained.notify_all()
            raise


def _drained_flush(log_queue, timeout: float = 3.0) -> bool:
    """Flower's ``flush_logs`` with its fixed 1 s replaced: wait (as Flower) until the queue is empty,
    then until the uploader has found it empty twice more (the second visit comes after the push of
    whatever it took at the first), at most 1 s and within ``timeout`` (as Flower)."""
    import time

    deadline = time.monotonic() + timeout
    while not log_queue.empty():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return True
    drained = getattr(log_queue, "drained", None)
    if drained is None:                                # not ours: Flower's wait
        time.sleep(min(1, remaining))
        return True
    target = log_queue.drains + 2
    with drained:
        drained.wait_for(lambda: log_queue.drains >= target, timeout=min(1.0, remaining))
    return True


def _report_bundle_modules(preloaded, wfd: int, bundles: bool = True, learn=(), loader=CLIENT_LOADER):
    """In a forked child: Flower loads the ClientApp with ``load_app(ref, error, project_dir)``;
    before that, drop the preloaded apps whose code this task would not import; at the end, tell
    the warm process (pipe ``wfd``) the task's bundle folder and the modules it imported from it,
    or, when the ClientApp's package was imported from outside the bundle (an installed package),
    that package's ``sys.path`` root and modules (``bundles``), and which of ``learn`` (module names)
    it imported that the warm process had not (``"warm"``; returns that report, called before the
    child exits)."""
    import importlib
    import json

    cu = importlib.import_module(loader)
    load, seen = cu.load_app, {}
    had = {n for n in learn if n in sys.modules}

    def load_app(ref, error_type, project_dir=None):
        if project_dir is not None:
            folder = os.path.abspath(str(project_dir))
            for other, tops in preloaded.items():
                if _shadowed(other, tops, folder):
                    _drop_bundle(other, tops)
            seen["dir"], seen["top"] = folder, str(ref).partition(":")[0].split(".")[0]
        return load(ref, error_type, project_dir)

    def report():
        info = {}
        if bundles and "dir" in seen:
            info = {"dir": seen["dir"], "modules": _bundle_modules(seen["dir"])}
            top = sys.modules.get(seen["top"])
            where = getattr(top, "__file__", None)
            if isinstance(where, str) and not _under(where, seen["dir"]):
                root = os.path.dirname(os.path.dirname(where)) if os.path.basename(where) == "__init__.py" \
                    else os.path.dirname(where)
                info["installed"] = {"root": root, "top": seen["top"],
                                     "modules": _bundle_modules(root, {seen["top"]})}
        warm = [n for n in learn if n in sys.modules and n not in had]
        if warm:
            info["warm"] = warm
        served = getattr(sys.modules.get(BLOCK_CACHE), "served_blocks", None)
        if bundles and callable(served):
            try:
                blocks = served()
            except Exception:                   # noqa: BLE001 - a speed-up only
                blocks = None
            if blocks:
                info["blocks"] = blocks
        if not info:
            return
        try:
            os.write(wfd, json.dumps(info).encode()[:60000])
        except OSError:
            pass

    replace("app-preload", cu, "load_app", load_app)
    return report


class _HotTime:
    """The ``time`` module as seen by Flower's SuperExec loop: its poll sleep is
    :data:`HOT_TASK_POLL_S` within :data:`HOT_WINDOW_S` after :meth:`active`.

    With ``wake`` (a bound, non-blocking UDP socket on loopback: ``--wake-port``), the sleep is a
    wait for a datagram on it instead, up to ``max(seconds, WAKE_POLL_S)``: the node
    (``flower-vfl-supernode --wake-executor``) sends one when it stored a message, a forked
    ClientApp when it ends; no hot polling. A datagram that came while the loop was asking the node
    for a task is still queued, so none is lost; without any, the loop polls every WAKE_POLL_S."""

    def __init__(self, wake=None):
        import math
        import time
        self._time, self.last, self.wake = time, -math.inf, wake
        self.wakes = 0

    def __getattr__(self, name):
        return getattr(self._time, name)

    def active(self) -> None:
        self.last = self._time.monotonic()

    def sleep(self, seconds):
        if self.wake is not None:
            import select
            ready, _, _ = select.select([self.wake], [], [], max(seconds, WAKE_POLL_S))
            if ready:
                self.wakes += 1
                try:
                    while self.wake.recv(64):          # drain: one wake for all that came
                        pass
                except OSError:                        # BlockingIOError: nothing left
                    pass
            return
        hot = self._time.monotonic() - self.last < HOT_WINDOW_S
        self._time.sleep(min(seconds, HOT_TASK_POLL_S) if hot else seconds)

    def poke(self) -> None:
        """Wake the loop (from a forked child at its end: its parent reaps it at once)."""
        if self.wake is not None:
            try:
                self.wake.sendto(b"x", self.wake.getsockname())
            except OSError:
                pass


def wake_socket(port: int):
    """The executor's end of ``--wake-port``: a non-blocking UDP socket bound to 127.0.0.1:port."""
    import socket
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", int(port)))
    sock.setblocking(False)
    return sock


def _reuse_installed_fabs(runtime=CLIENT_RUNTIME) -> None:
    """In a forked child: a FAB whose bytes (SHA-256) this node's ClientApps already installed is
    not extracted and hash-verified again (Flower does both for every message, then finds the app
    installed and keeps it). The note is written after Flower's own install of those bytes succeeded,
    in ``$FLWR_HOME/apps/.flower-vfl-installed/<sha256>`` (the party's own disk).

    A ClientApp's (``runtime`` = :data:`CLIENT_RUNTIME`) pull of its task input also names the FABs
    those notes list, and a FAB its node then sends without content
    (:class:`~flower_vfl.deploy.installed_fab.InstalledFab`: the ``fab-announce`` / ``fab-skip``
    patches of :mod:`flower_vfl.deploy.installed_fab`) is the folder Flower installed those bytes in."""
    import hashlib
    import importlib
    from pathlib import Path

    rc = importlib.import_module(runtime)
    install = rc.install_from_fab

    def install_from_fab(fab_file, install_dir=None, skip_prompt=False):
        if isinstance(fab_file, InstalledFab) and install_dir is None:
            return fab_file.path              # verified at its install; checked against the run's load folder
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir, skip_prompt)
        note = note_dir() / hashlib.sha256(fab_file).hexdigest()
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

    replace("fab-reuse", rc, "install_from_fab", install_from_fab)
    if runtime == CLIENT_RUNTIME:
        announce_installed_fabs(runtime)


#: what :func:`watch_force_exit` logs (task id, seconds)
FORCE_EXIT_LINE = ("[warm_exec] task %d: Flower ended the ClientApp %.1f s into its exit (flwr_exit's force exit, "
                   "FORCE_EXIT_TIMEOUT_SECONDS) before its exit handlers were done: the push of its final status and "
                   "context.state may not have reached the SuperNode, which then keeps the run's previous "
                   "context.state and, when the task's token expires (up to 60 s later), answers the run's message "
                   "in flight with Flower's 'ClientApp stopped responding'. Keep context.state small "
                   "(docs/benchmarks.md, 10M rows)")


def _observe(info) -> list:
    """In a forked task: each observer of :data:`flower_vfl.deploy.hooks.FORK` called with ``info``;
    the ``finish`` callables they returned (an observer that fails is skipped)."""
    out = []
    for observe in hooks.FORK if info is not None else ():
        try:
            done = observe(dict(info))
        except Exception:                          # noqa: BLE001 - an observer never fails a task
            continue
        if callable(done):
            out.append(done)
    return out


def watch_force_exit(task_id: int, on_force_exit=()) -> bool:
    """In a forked ClientApp: Flower's ``flwr_exit`` runs the ClientApp's exit handlers (among
    them the push of the task's final status and context, ``push_task_output``) after starting a
    thread that ends the process with ``os._exit`` 5 s later. When that thread fires, log
    :data:`FORCE_EXIT_LINE` (one ERROR line in the executor's log; the child never returns to say
    it otherwise) and call each of ``on_force_exit`` with ``(code, force=True)`` (the observers of
    :data:`flower_vfl.deploy.hooks.FORK`, e.g. a benchmark's timing line). Returns
    False (nothing watched) on a Flower whose exit module is not the one this was read in."""
    import time

    try:
        import flwr.supercore.exit.exit as fx
    except ImportError:
        fx = None
    if not applicable("force-exit-watch", ["flwr.supercore.exit.exit"] if fx is None else
                      [m for m, ok in (("exit.os as the os module", getattr(fx, "os", None) is os),
                                       ("os._exit(sys_exit_code)", "os._exit(sys_exit_code)" in _source(fx)))
                       if not ok]):
        return False
    import flwr.supercore.exit.signal_handler as sh
    import flwr.supernode.runtime.run_clientapp as rc
    began = time.monotonic()
    for mod in (rc, sh):       # when the exit began: run_clientapp's own call, or a signal's (SIGINT/TERM)
        flwr_exit = getattr(mod, "flwr_exit", None)
        if callable(flwr_exit):
            def timed_exit(*a, _flwr_exit=flwr_exit, **k):
                nonlocal began
                began = time.monotonic()
                return _flwr_exit(*a, **k)
            replace("force-exit-watch", mod, "flwr_exit", timed_exit)

    class _Os:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def _exit(code):
            try:
                from logging import ERROR

                from flwr.supercore import log
                log(ERROR, FORCE_EXIT_LINE, task_id, time.monotonic() - began)
                sys.stdout.flush()
                sys.stderr.flush()
                for done in on_force_exit:
                    try:
                        done(code, force=True)
                    except Exception:              # noqa: BLE001 - the exit goes on
                        pass
            finally:
                os._exit(code)
    replace("force-exit-watch", fx, "os", _Os())
    return True


def _source(mod) -> str:
    import inspect
    try:
        return inspect.getsource(mod)
    except (OSError, TypeError):
        return ""


def preload_installed(preloader: AppPreloader, module: str) -> int:
    """Import ``module`` of an installed package with ``preloader`` (as :meth:`AppPreloader.preload`
    does for what a finished task reported: its ``sys.path`` root, its top-level name); returns how
    many of that package's modules it imported. A module that is not installed warns and does nothing."""
    import importlib.util
    import warnings

    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not os.path.isfile(origin):
        warnings.warn(f"flower_vfl.deploy.warm_exec: --preload-package {module}: {top} is not an installed "
                      "package here; not preloaded", stacklevel=1)
        return 0
    root = os.path.dirname(os.path.dirname(origin)) if os.path.basename(origin) == "__init__.py" \
        else os.path.dirname(origin)
    return preloader.preload(root, [module], {top})


def blas_timeout_env(environ=None) -> bool:
    """``$OPENBLAS_THREAD_TIMEOUT`` to :data:`BLAS_THREAD_TIMEOUT` in this process (and so in every
    child it forks or starts) unless the operator set it; returns whether it was set here. Called
    before numpy is imported: OpenBLAS reads it once, when it is loaded; nothing is set (False)
    when numpy is already loaded. Speed only: the BLAS thread count and every result are unchanged."""
    environ = os.environ if environ is None else environ
    if BLAS_TIMEOUT_ENV in environ or "numpy" in sys.modules:
        return False
    environ[BLAS_TIMEOUT_ENV] = BLAS_THREAD_TIMEOUT
    return True


def import_private_libraries(names=WARM_PRIVATE) -> list[str]:
    """Import the installed ones among ``names`` (of :data:`WARM_PRIVATE`) in this process; returns
    those newly imported."""
    import importlib
    import importlib.util

    new = []
    for mod in names:
        if mod not in WARM_PRIVATE or mod in sys.modules:
            continue
        try:
            if importlib.util.find_spec(mod.split(".")[0]) is None:
                continue
            importlib.import_module(mod)
        except Exception as exc:             # noqa: BLE001 - a forked child imports it itself then
            import warnings
            warnings.warn(f"flower_vfl.deploy.warm_exec: importing {mod} failed ({type(exc).__name__}: "
                          f"{exc}); each private message's process imports it itself", stacklevel=1)
            continue
        new.append(mod)
    return new


def _fork_executor(clock=None, preloader=None, learn=False):
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

        def __init__(self, *args, clock=None, preloader=None, learn=False, **kwargs):
            super().__init__(*args, **kwargs)
            self._learn = learn                 # import WARM_PRIVATE here once a child imported them
            self._forked: dict[int, int | None] = {}   # pid of a child launch() forked -> its pipe
            self._clock = clock                 # the loop's _HotTime: a launch / an exit -> hot
            self._preloader = preloader         # AppPreloader, or None: every child imports its app

        def launch(self, spec):
            server = spec.task_type == TaskType.SERVER_APP
            if spec.task_type not in (TaskType.CLIENT_APP, TaskType.SERVER_APP) or not hasattr(os, "fork") \
                    or (server and not serverapp_forkable()):
                return super().launch(spec)
            certificates = validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure)
            t0, t_fork = time.monotonic(), time.time()
            if self._clock is not None:
                self._clock.active()
            rfd, wfd = os.pipe() if self._preloader is not None or self._learn else (None, None)
            preloaded = dict(self._preloader.apps) if self._preloader is not None else {}
            pid = os.fork()
            if pid:
                if wfd is not None:
                    os.close(wfd)
                    os.set_blocking(rfd, False)
                self._forked[pid] = rfd
                return LaunchResult.accepted()
            code, report = 0, None
            # as Flower's launch does (spec.suppress_output: stdout/stderr to DEVNULL; its SuperLink
            # asks it for ServerApps, whose output reaches the SuperLink by the log upload instead)
            kept = _silence_output() if getattr(spec, "suppress_output", False) else None
            # what the observers of flower_vfl.deploy.hooks get (none in the product; benchmarks' timing)
            info = {"who": "serverapp" if server else "party", "task": spec.task_id, "pid": os.getpid(),
                    "t_fork": t_fork, "modules_at_fork": {m.split(".")[0] for m in sys.modules}} \
                if hooks.FORK else None
            finish = []
            if rfd is not None:
                os.close(rfd)
            try:                          # the child: what flwr-clientapp's (flwr-serverapp's) main does
                # the app's code comes from the task's FAB, as in flwr-clientapp: no module of this
                # package as started, nor of another preloaded bundle; numpy's global RNG reseeded
                _child_after_fork(preloaded)
                if wfd is not None:
                    report = _report_bundle_modules(preloaded, wfd, bundles=self._preloader is not None,
                                                    learn=WARM_PRIVATE if self._learn and not server else (),
                                                    loader=SERVER_LOADER if server else CLIENT_LOADER)
                _reuse_installed_fabs(SERVER_RUNTIME if server else CLIENT_RUNTIME)
                if server:
                    patch_serverapp_flush()
                    finish = _observe(info)
                    _run_serverapp(spec, certificates)
                else:
                    finish = _observe(info)
                    watch_force_exit(spec.task_id, finish)
                    run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token,
                                  insecure=spec.insecure, certificates=certificates, parent_pid=spec.parent_pid,
                                  runtime_dependency_install=spec.runtime_dependency_install)
            except SystemExit as exc:                 # flwr_exit ends the task with sys.exit
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:                     # noqa: BLE001 - never return into the parent's loop
                code = 1
            finally:
                try:
                    if kept is not None:                 # this executor's own line goes to its log
                        _restore_output(kept)
                    log(INFO, "[warm_exec] task %d: forked %s and its exit handlers done in %.3f s "
                        "(exit %s)", spec.task_id, "ServerApp" if server else "ClientApp", time.monotonic() - t0,
                        code)
                    for done in finish:
                        done(code)
                    if report is not None and code == 0:
                        report()
                    if self._clock is not None:
                        self._clock.poke()           # the parent reaps this child at once
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)

        def reconcile(self) -> None:
            """Reap the finished children this executor forked (no zombies; the processes
            Flower's own launch started are left to its Popen bookkeeping), then Flower's."""
            for pid, rfd in list(self._forked.items()):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    del self._forked[pid]
                    if rfd is not None:
                        self._preload_from(rfd)
                    if self._clock is not None:
                        self._clock.active()
            super().reconcile()

        def _preload_from(self, rfd: int) -> None:
            """What a finished child reported (its bundle folder, the modules it imported from it):
            imported here, so the next children of that bundle are forked with them."""
            import json

            chunks = []
            try:
                while chunk := os.read(rfd, 65536):
                    chunks.append(chunk)
            except (BlockingIOError, OSError):
                pass
            finally:
                os.close(rfd)
            try:
                info = json.loads(b"".join(chunks)) if chunks else None
            except ValueError:
                info = None
            if not isinstance(info, dict):
                return
            t = time.monotonic()
            warm = info.get("warm")
            if self._learn and isinstance(warm, list):
                new = import_private_libraries([n for n in warm if isinstance(n, str)])
                if new:
                    log(INFO, "[warm_exec] a ClientApp of this node imported %s (a private party): imported here "
                        "in %.3f s, the next messages are forked with them", ", ".join(new), time.monotonic() - t)
                    t = time.monotonic()
            if self._preloader is None:
                return
            self._preload_modules(info, t)
            self._preload_blocks(info.get("blocks"))

        def _preload_modules(self, info: dict, t: float) -> None:
            inst = info.get("installed")
            if isinstance(inst, dict) and isinstance(inst.get("root"), str) and isinstance(inst.get("top"), str) \
                    and isinstance(inst.get("modules"), list):
                where, n = inst["root"], self._preloader.preload(inst["root"], inst["modules"], {inst["top"]})
            elif isinstance(info.get("dir"), str) and isinstance(info.get("modules"), list):
                where, n = info["dir"], self._preloader.preload(info["dir"], info["modules"])
            else:
                return
            if n:
                log(INFO, "[warm_exec] imported %d modules of the app in %s here in %.3f s "
                    "(the next messages of that bundle are forked with them)", n, where, time.monotonic() - t)

        def _preload_blocks(self, blocks) -> None:
            """The verified cached blocks a finished child was served, mapped here by the preloaded
            app's block cache (``flower_vfl.io.party_cache.preload_blocks``: nothing parsed, hashed or
            written; a child uses one only for the request it computes itself, while the files keep
            their stat keys), so the next children are forked with them; ``$FLOWER_VFL_WARM_BLOCKS``
            0/false/no/off: not done."""
            if not blocks or not warm_blocks_enabled():
                return
            preload = getattr(sys.modules.get(BLOCK_CACHE), "preload_blocks", None)
            if not callable(preload):
                return
            t = time.monotonic()
            try:
                n = preload(blocks)
            except Exception:                   # noqa: BLE001 - a speed-up only: the child reads its block
                n = 0
            if n:
                log(INFO, "[warm_exec] mapped %d verified cached block(s) of the party here in %.3f s (the next "
                    "messages are forked with them)", n, time.monotonic() - t)

    return ForkExecutor(clock=clock, preloader=preloader, learn=learn)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (its --port)")
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--root-certificates", default=None)
    ap.add_argument("--parent-pid", type=int, default=None)
    ap.add_argument("--accountants", choices=ACCOUNTANTS, default=None,
                    help=f"when to import {', '.join(WARM_PRIVATE)} (opacus: torch, ~235 MB) here, for a private "
                         "party's messages: auto (default: once a forked ClientApp of this node imported them, "
                         "i.e. after its first private message; never for a non-private party), eager (at start), "
                         "off (never: ~3-4 s more per private message)")
    ap.add_argument("--lean", action="store_true", help="the same as --accountants off")
    ap.add_argument("--wake-port", type=int, default=None,
                    help="a UDP port on 127.0.0.1 to wait on between task polls: the SuperNode "
                         "(flower-vfl-supernode --wake-executor PORT) sends a datagram when it stored a message; "
                         f"the loop then polls every {WAKE_POLL_S:g} s at most, with no hot polling")
    ap.add_argument("--no-preload", action="store_true",
                    help="do not import an app bundle's modules here: every message's process imports them "
                         "(as flwr-clientapp does; ~0.5-1 s a message)")
    ap.add_argument("--app", choices=("clientapp", "serverapp"), default="clientapp",
                    help="whose tasks this executor's warm imports are for: a SuperNode's ClientApps (default) or, "
                         "pointed at a SuperLink started with --isolation process, its ServerApps (it runs "
                         "whichever of the two its Runtime API hands it)")
    ap.add_argument("--preload-package", action="append", default=[], metavar="MODULE",
                    help="a module of an installed package (e.g. flower_vfl.apps.server) imported here at start, "
                         "as if a finished task of an app bundle whose app is that installed package had reported "
                         "it, so the first task is forked with it too; a bundle that ships its own copy of the "
                         "package drops it in its child (repeatable)")
    args = ap.parse_args(argv)
    if args.app == "serverapp" and (args.accountants is not None or args.lean):
        ap.error("--accountants/--lean are for a party's executor (--app clientapp): a ServerApp's executor never "
                 "imports the accountants' libraries; remove them")
    blas_timeout_env()                   # before OpenBLAS is loaded: it reads the timeout once
    from flower_vfl.deploy.supernode import telemetry_off_by_default
    telemetry_off = telemetry_off_by_default()
    import importlib
    import inspect
    import time
    import warnings

    import flwr.supercore.superexec.run_superexec as rs

    missing = [FLOWER_TASK_SLEEP if FLOWER_TASK_SLEEP not in inspect.getsource(rs) else "",
               "" if callable(getattr(rs, "get_executor", None)) else "run_superexec.get_executor"]
    if applicable("superexec-fork", missing, stacklevel=1):
        accountants = "off" if args.lean or args.app == "serverapp" else args.accountants or "auto"
        for mod in SERVER_WARM_IMPORTS if args.app == "serverapp" else WARM_IMPORTS:
            importlib.import_module(mod)
        if args.app == "clientapp":
            client_code_missing(CLIENT_RUNTIME)    # fab-announce's check of Flower's code: once, here
        if accountants == "eager":
            import_private_libraries()
        from flower_vfl.deploy.supernode import fast_object_retries
        fast_object_retries()            # inherited by every forked ClientApp: its pulls from its node
        if telemetry_off:                # Flower's event() still gathers ids and platform data (~0.4 s
            from flwr.supercore.telemetry import EventType, create_event   # first time): once, here
            create_event(EventType.FLWR_CLIENTAPP_RUN_ENTER, None)         # (off: nothing is sent)
        wake = None
        if args.wake_port:
            try:
                wake = wake_socket(args.wake_port)
            except OSError as exc:
                warnings.warn(f"flower_vfl.deploy.warm_exec: cannot listen on UDP 127.0.0.1:{args.wake_port} "
                              f"({exc}); polling for tasks instead", stacklevel=1)
        clock = _HotTime(wake)
        preloader = None if args.no_preload else AppPreloader()
        if preloader is not None:
            for mod in args.preload_package:
                t = time.monotonic()
                n = preload_installed(preloader, mod)
                if n:
                    from logging import INFO

                    from flwr.supercore import log
                    log(INFO, "[warm_exec] imported %d modules of the app in %s here in %.3f s (--preload-package %s: "
                        "the first task is forked with them)", n, next(iter(preloader.apps)), time.monotonic() - t, mod)
        executor = _fork_executor(clock, preloader, learn=accountants == "auto")
        replace("superexec-fork", rs, "get_executor", lambda *a, **k: executor)   # the ClientApp launch
        replace("superexec-fork", rs, "time", clock)   # the task poll: hot after a launch / an exit
    rs.run_superexec(runtime_api_address=args.runtime_api_address, insecure=args.insecure,
                     root_certificates_path=args.root_certificates, parent_pid=args.parent_pid,
                     runtime_dependency_install=False)


if __name__ == "__main__":
    main()
