"""Every change flower-vfl makes to Flower's private modules: one list, one version check, one warning.

Flower (1.41 / 1.42) has no hook for what the loopback deployment and the simulation speed-up need
(a SuperNode's poll sleeps, its executor's process launch, a forked ServerApp's log flush, the
simulation's delivery tick), so a few of its module attributes are replaced at run time. Each such
change is a :class:`Patch` in :data:`PATCHES`: its name, the attributes it replaces
(``"module:attribute"``, or ``"module.Class:attribute"``), why, the Flower releases it was read in,
the module of ours that applies it, and what runs instead on any other release.

Every patch site asks :func:`applicable` first (the one version check: the installed release is one
the patch was read in, and the code it replaces is still there) and sets attributes only through
:func:`replace` / :func:`set_kwdefault`, which refuse a target the list does not name (a bug, not a
user error). On a Flower release the list does not know, or where Flower's code changed, nothing
is touched: one warning line names the patch and the Flower version, and Flower's own behaviour
runs (:data:`Patch.fallback`). ``tests/test_flower_patches.py`` fails on an installed Flower the
list does not know, so a Flower upgrade re-reads these patches before it ships.

The benchmark timing hooks (``benchmark-timing``) are listed too, though they are not in the
product: ``benchmarks/timing/`` installs them from outside, through the observer lists of
:mod:`flower_vfl.deploy.hooks`, when a benchmark sets ``$FLOWER_VFL_TIMING``.

Not patches: setting ``TaskIdentity``'s run/task/node id in ``deploy/local_grid.py`` (Flower's own
setters, as its runtime does), and reading the simulation engine's delivery thread
(``sim-delivery-wake`` below replaces nothing: it finds the thread and wakes the ``Event`` it sleeps
on; see :mod:`flower_vfl.strategies.sim_delivery` for why no public way does this).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

__all__ = ["FLOWER_RELEASES", "Patch", "PATCHES", "FlowerPatchWarning", "flower_version", "known_release",
           "applicable", "replace", "set_kwdefault", "patch"]

#: the Flower releases every patch below was read in (its code compared line by line)
FLOWER_RELEASES = ("1.41.", "1.42.")


class FlowerPatchWarning(UserWarning):
    """A patch of Flower was not applied: this Flower release or its code is not the one it was read in."""


@dataclass(frozen=True)
class Patch:
    """One change to Flower's private code (see the module docstring)."""

    name: str
    #: what is replaced: ``"module:attribute"`` (a class's attribute: ``"module.Class:attribute"``;
    #: a function's keyword default: ``"module:function.__kwdefaults__[name]"``)
    targets: tuple[str, ...]
    why: str
    #: what runs instead when the patch is not applied (Flower's own behaviour)
    fallback: str
    #: the module of flower_vfl (or benchmarks/) that applies it
    where: str
    releases: tuple[str, ...] = FLOWER_RELEASES


_SCI = "flwr.supernode.start_client_internal"
_CONN = "flwr.supernode.fleet_http_connection"
_RC = "flwr.supernode.runtime.run_clientapp"
_RS = "flwr.superlink.runtime.run_serverapp"
_IU = "flwr.supercore.inflatable.inflatable_utils"

PATCHES: tuple[Patch, ...] = (
    Patch("supernode-poll", (f"{_SCI}:time", f"{_SCI}:_push_messages", f"{_SCI}:_pull_and_store_message"),
          "Flower's SuperNode loop sleeps a hard-coded 3 s when a pull found no message and 0.5 s between its "
          "looks for the ClientApp's reply; flower-vfl-supernode's --idle-poll / --hot-poll shorten them",
          "running Flower's SuperNode unpatched (Flower's own 3 s idle poll)", "flower_vfl.deploy.supernode"),
    Patch("supernode-wake-executor", (f"{_SCI}:_pull_and_store_message",),
          "--wake-executor: one UDP datagram to the warm executor when the node stored a message",
          "--wake-executor is ignored (the executor finds each task at its next poll, up to 1 s later)",
          "flower_vfl.deploy.supernode"),
    Patch("object-retry-backoff", (f"{_IU}:pull_objects.__kwdefaults__[initial_backoff]",
                                   f"{_IU}:pull_objects.__kwdefaults__[backoff_cap]",
                                   f"{_IU}:pull_and_inflate_object_from_tree.__kwdefaults__[initial_backoff]",
                                   f"{_IU}:pull_and_inflate_object_from_tree.__kwdefaults__[backoff_cap]"),
          "an object pulled before it is stored is asked for again after 10 ms, doubling up to 0.5 s "
          "(Flower: 1 s up to 10 s)", "Flower's own retry backoff (1 s) is kept", "flower_vfl.deploy.supernode"),
    Patch("telemetry-off", ("flwr.supercore.telemetry:FLWR_TELEMETRY_ENABLED",),
          "Flower reads $FLWR_TELEMETRY_ENABLED once at import; its module copy follows the default set here "
          "(off unless the variable is set)", "telemetry follows $FLWR_TELEMETRY_ENABLED as Flower read it at import",
          "flower_vfl.deploy.supernode"),
    Patch("activation-retry", ("flwr.supernode.fleet_http_client.FleetHttpClient:ActivateNode",),
          "a node restarted after a kill is refused (code 2004) until its previous session misses its heartbeats; "
          "it asks again every 3 s for up to 65 s", "a refused activation ends the node at once, as in Flower",
          "flower_vfl.deploy.supernode"),
    Patch("tls-mismatch-hint", (f"{_CONN}:make_simple_http_retry_invoker",),
          "a --insecure/TLS mismatch with the SuperLink is diagnosed by one TLS probe and named in one line",
          "a --insecure/TLS mismatch with the SuperLink is retried without a hint, as in Flower",
          "flower_vfl.deploy.supernode"),
    Patch("heartbeat-interval", (f"{_CONN}:HEARTBEAT_DEFAULT_INTERVAL",
                                 "flwr.supercore.heartbeat:HEARTBEAT_DEFAULT_INTERVAL"),
          "--heartbeat: the interval the node announces and keeps (Flower: 30 s, no flag)",
          "--heartbeat ignored, Flower's interval kept", "flower_vfl.deploy.supernode"),
    Patch("superexec-fork", ("flwr.supercore.superexec.run_superexec:get_executor",
                             "flwr.supercore.superexec.run_superexec:time"),
          "the SuperExec forks each ClientApp / ServerApp from a warm process (Flower: a new interpreter per "
          "message) and polls for the next task every 10 ms near a launch or on a UDP wake",
          "running Flower's SuperExec unpatched (a new flwr-clientapp process per message)",
          "flower_vfl.deploy.warm_exec"),
    Patch("serverapp-fork", (),
          "a forked ServerApp runs flwr-serverapp's code (run_serverapp, load_app, the log mirroring) in the "
          "forked child; nothing replaced, the calls need that code as read",
          "each run starts a new flwr-serverapp instead of a forked one", "flower_vfl.deploy.warm_exec"),
    Patch("serverapp-flush", (f"{_RS}:flush_logs",),
          "a forked ServerApp's final log flush waits for its uploader's last push instead of a fixed 1 s sleep",
          "Flower's flush_logs (1 s) is kept", "flower_vfl.deploy.warm_exec"),
    Patch("app-preload", ("flwr.clientapp.utils:load_app", "flwr.server.run_serverapp:load_app"),
          "in a forked child: learn the app bundle's folder, so the warm process imports its modules for the next "
          "children (applied with superexec-fork)", "every child imports its app itself",
          "flower_vfl.deploy.warm_exec"),
    Patch("fab-reuse", (f"{_RC}:install_from_fab", f"{_RS}:install_from_fab"),
          "in a forked child: a FAB whose bytes this node already installed is not extracted and verified again "
          "(applied with superexec-fork)", "Flower extracts and verifies the FAB for every message",
          "flower_vfl.deploy.warm_exec"),
    Patch("fab-announce", (f"{_RC}:pull_task_input",),
          "in a forked ClientApp: its PullTaskInput request names the FABs this node installed (their SHA-256, "
          "in a field Flower does not define); a FAB its node then sends without content is the folder Flower "
          "installed those verified bytes in, used only when it is the folder Flower loads the app from "
          "(applied with superexec-fork)", "the ClientApp gets every FAB's content, as in Flower",
          "flower_vfl.deploy.installed_fab (from flower_vfl.deploy.warm_exec)"),
    Patch("fab-skip", ("flwr.supernode.servicer.runtime.runtime_handlers:pull_task_input",),
          "flower-vfl-supernode: a ClientApp that named the run's FAB hash as installed gets the FAB without its "
          "content (1.6 MB a message for flower-vfl's bundle); any other hash, or no such name, gets the full FAB "
          "($FLOWER_VFL_FAB_RESEND=1: always)", "every ClientApp gets the FAB's content with every message, as in "
          "Flower", "flower_vfl.deploy.installed_fab (from flower_vfl.deploy.supernode)"),
    Patch("force-exit-watch", ("flwr.supercore.exit.exit:os", f"{_RC}:flwr_exit",
                               "flwr.supercore.exit.signal_handler:flwr_exit"),
          "a forked ClientApp that Flower's force exit (os._exit 5 s into flwr_exit) ends logs one ERROR line",
          "a force exit ends the ClientApp silently, as in Flower", "flower_vfl.deploy.warm_exec"),
    Patch("sim-delivery-wake", (),
          "in Flower's simulation, wake the engine's delivery thread (vce_api.add_messages_to_queue, sleeping on "
          "f_stop.wait(0.1)) after each push instead of waiting for its tick; nothing replaced, the thread's "
          "Event is found and notified", "each round waits for Flower's 0.1 s delivery tick",
          "flower_vfl.strategies.sim_delivery"),
    Patch("benchmark-timing", (f"{_SCI}:_pull_and_store_message", f"{_SCI}:_push_messages",
                               "flwr.supernode.nodestate.in_memory_nodestate.InMemoryNodeState:claim_task",
                               "flwr.supernode.nodestate.in_memory_nodestate.InMemoryNodeState:activate_task",
                               "flwr.supernode.nodestate.in_memory_nodestate.InMemoryNodeState:"
                               "acknowledge_task_heartbeat",
                               "flwr.supernode.nodestate.in_memory_nodestate.InMemoryNodeState:finish_task",
                               "flwr.supernode.nodestate.in_memory_nodestate.InMemoryNodeState:"
                               "_on_task_tokens_expired",
                               "flwr.clientapp.client_app.ClientApp:__call__", f"{_RC}:RuntimeHttpClient",
                               f"{_RC}:HeartbeatSender", f"{_RC}:get_load_client_app_fn",
                               f"{_RC}:make_task_heartbeat_fn_http", f"{_RC}:flwr_exit",
                               *(f"{_RC}:{n}" for n in ("pull_task_input", "install_from_fab", "push_message",
                                                        "push_task_output", "event", "start_parent_process_monitor",
                                                        "cleanup_app_runtime_environment",
                                                        "register_signal_handlers")),
                               *(f"{_RS}:{n}" for n in ("install_from_fab", "get_fab_metadata", "get_project_config",
                                                        "get_fused_config_from_dir", "run_", "flush_logs",
                                                        "start_log_uploader", "stop_log_uploader", "event",
                                                        "start_parent_process_monitor",
                                                        "cleanup_app_runtime_environment",
                                                        "register_signal_handlers"))),
          "benchmarks only ($FLOWER_VFL_TIMING): timestamps of a node's pulls and replies, its task tokens, and "
          "the stages of each forked ClientApp / ServerApp", "no timing lines are written",
          "benchmarks/timing/flower_vfl_timing.py (through flower_vfl.deploy.hooks)"),
)

_BY_NAME = {p.name: p for p in PATCHES}
assert len(_BY_NAME) == len(PATCHES), "two patches share a name"


def flower_version() -> str:
    """The installed Flower's version string (``"?"`` when it has none)."""
    import flwr
    return str(getattr(flwr, "__version__", "?"))


def known_release(version: str | None = None, name: str | None = None) -> bool:
    """Is ``version`` (default: the installed Flower's) a release the patches (or patch ``name``) were read in?"""
    releases = _BY_NAME[name].releases if name else FLOWER_RELEASES
    return (flower_version() if version is None else version).startswith(releases)


def applicable(name: str, missing=(), stacklevel: int = 2) -> bool:
    """The one version check: True when the installed Flower is a release patch ``name`` was read in
    and ``missing`` (what the caller found absent from Flower's code: names, source lines) is empty.
    Otherwise one warning line (:class:`FlowerPatchWarning`) naming the patch, the Flower version,
    what differs and what runs instead, and False: the caller then touches nothing."""
    p = _BY_NAME[name]
    version = flower_version()
    missing = [str(m) for m in missing if m]
    if version.startswith(p.releases) and not missing:
        return True
    if not version.startswith(p.releases):
        why = f"flwr {version} is not one of {', '.join(r + 'x' for r in p.releases)}"
    else:
        why = f"flwr {version}'s code has no {', '.join(missing)}"
    warnings.warn(f"flower-vfl: Flower patch '{name}' not applied ({why}); {p.fallback}", FlowerPatchWarning,
                  stacklevel=stacklevel + 1)
    return False


def _owner(obj) -> str:
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return getattr(obj, "__name__", repr(obj))


def _check_target(name: str, target: str) -> None:
    if target not in _BY_NAME[name].targets:
        raise LookupError(f"flower_vfl.flower_patches: patch {name!r} does not list {target!r}; add it to PATCHES "
                          "(with why and the Flower releases it was read in) before replacing it")


def replace(name: str, owner, attribute: str, value):
    """Set ``owner.attribute`` (``owner``: one of Flower's modules or classes) to ``value`` for patch
    ``name``, which must list it; returns the previous value. Call :func:`applicable` first."""
    _check_target(name, f"{_owner(owner)}:{attribute}")
    old = getattr(owner, attribute, None)
    setattr(owner, attribute, value)
    return old


def set_kwdefault(name: str, fn, keyword: str, value):
    """Set the keyword-only default ``keyword`` of Flower's function ``fn`` for patch ``name``, which
    must list it; returns the previous default."""
    _check_target(name, f"{fn.__module__}:{fn.__qualname__}.__kwdefaults__[{keyword}]")
    old = fn.__kwdefaults__[keyword]
    fn.__kwdefaults__[keyword] = value
    return old


def patch(name: str) -> Patch:
    """The entry of patch ``name``."""
    return _BY_NAME[name]
