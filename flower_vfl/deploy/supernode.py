"""``flower-vfl-supernode``: Flower's ``flower-supernode`` with shorter polling waits (flwr 1.41/1.42).

Flower's SuperNode loop (``flwr/supernode/start_client_internal.py``) pulls the SuperLink for a
message and, when there is none, sleeps a hard-coded **3 s** (no flag, no environment variable);
while a ClientApp works it looks for the reply every 0.5 s. In a round of vertical ADMM every
party replies and then waits for the next round's message, so every round pays most of those
sleeps (docs/benchmarks.md, "Latency of a round on real SuperNodes").

This runs Flower's own ``flower-supernode`` entry point, unchanged in every argument and
behaviour, except for the sleeps *inside that one module*:

- ``--idle-poll`` (default 0.5 s): the idle sleep of a node that has been idle for a while;
- ``--hot-poll`` (default 0.02 s; 0: off): the idle sleep for 2 s after the node sent a reply (the
  next round's message is near), and 10 ms between its looks for the ClientApp's reply (a look-up
  in the node's own state);
- the looks for the ClientApp's reply come every 5 % of the time it has taken so far (10 ms to
  0.1 s), and once the node has seen how long after its reply its next message comes, the hot
  window opens near then (0.8 x the shortest of the last 3 such gaps), not right after the reply;
- ``--wake-executor PORT``: one UDP datagram to 127.0.0.1:PORT each time the node stored a
  message, for its warm executor (``warm_exec --wake-port PORT``), which then asks for the task at
  once instead of polling the node every 10 ms;
- a pulled object the SuperLink does not have yet is asked for again after 10 ms, doubling up to
  0.5 s (Flower: 1 s, up to 10 s), as in every forked ClientApp of the warm executor;
- a ClientApp of the warm executor that names the run's app bundle (FAB) as installed gets it
  without its content (Flower: the whole FAB, 1.6 MB for flower-vfl's, with every message;
  :mod:`flower_vfl.deploy.installed_fab`; ``FLOWER_VFL_FAB_RESEND=1``: as in Flower).

    flower-vfl-supernode --idle-poll 0.5 --superlink link.example.org:9092 \\
        --root-certificates ca.crt --node-config "partition-id=1 data-path='...'"

- ``--heartbeat`` (default: Flower's 30 s): seconds between the node's heartbeats as it announces
  them to the SuperLink (10..1800, the SuperLink's range). The SuperLink marks a node offline two
  intervals after its last heartbeat, so a killed node is noticed, and its restart admitted,
  after ~20 s at 10 (~60 s at Flower's 30); a node stalled longer than that (a loaded machine)
  is taken for gone.

A SuperNode restarted after a kill is refused by the SuperLink (code 2004) while its previous
session is still online (until two heartbeats are missed, ~60 s); it asks again every 3 s for up
to 65 s, saying why in one log line, then exits as Flower does (Flower: exits at once).

A node started with ``--insecure`` against a SuperLink that serves TLS (or with TLS against a plain
one) fails every attempt; Flower retries forever saying only "Connection attempt failed" (and a TLS
node exits with an SSL error). Here the first such failure probes the SuperLink's address with one
TLS handshake (no certificate check, 3 s; once more if it got no answer) and, on a mismatch, logs
one line saying which flag to change; a node with ``--insecure`` then exits (Flower's code 305,
the same line) after 3 failed attempts instead of retrying forever.

Flower's telemetry (an HTTP POST when a process starts and, waited for, when it exits) is off in
this node and the processes it starts unless ``FLWR_TELEMETRY_ENABLED`` is set (``=1``: on).

Each patch is listed in :mod:`flower_vfl.flower_patches` (what it replaces, why, the Flower
releases it was read in) and checked there (:func:`~flower_vfl.flower_patches.applicable`): on
another release, or where Flower's loop no longer has what it replaces, the SuperNode runs as
Flower ships it and says so in one warning line naming the patch and the Flower version.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import socket
import ssl
import sys
import time

from flower_vfl.deploy import hooks
from flower_vfl.deploy.installed_fab import serve_installed_fabs
from flower_vfl.flower_patches import applicable, replace, set_kwdefault

__all__ = ["IDLE_POLL_S", "HOT_POLL_S", "cap_idle_sleep", "hint_tls_mismatch", "main", "probe_tls", "set_heartbeat",
           "wake_executor",
           "telemetry_off_by_default"]

#: default idle poll of ``flower-vfl-supernode`` and of ``flower-vfl deploy-local`` (seconds)
IDLE_POLL_S = 0.5
#: the range accepted for ``--idle-poll`` (below 0.05 s an idle node is ~20 requests a second;
#: above 3 s is slower than Flower's own loop)
IDLE_POLL_RANGE = (0.05, 3.0)
#: after the node sent a reply it pulls every ``--hot-poll`` seconds (default) for
#: :data:`HOT_WINDOW_S` seconds: the next round's message usually comes within a fraction of a
#: second; then every ``--idle-poll``. 0 turns it off (every idle pull ``--idle-poll`` apart).
HOT_POLL_S, HOT_WINDOW_S = 0.02, 2.0
#: the hot window opens at HOT_LEAD of the shortest of the last HOT_GAPS times from the node's
#: reply to its next message (at once until the node has seen one)
HOT_LEAD, HOT_GAPS = 0.8, 3
HOT_POLL_RANGE = (0.01, 0.5)
#: the node's waits for its ClientApp's reply (a look-up in the node's own state, no network;
#: Flower: every 0.5 s) when the hot poll is on
REPLY_POLL_S = 0.01
#: ... growing with the time the ClientApp has taken so far: a look every REPLY_POLL_FRACTION of
#: it (a reply is seen at most 5 % late), at most every REPLY_POLL_CAP_S (Flower: 0.5 s). 16
#: ClientApps sharing 2 cores take seconds each: ~100 looks instead of ~1,000 per message.
REPLY_POLL_FRACTION, REPLY_POLL_CAP_S = 0.05, 0.1
#: what the patch replaces, read in flwr 1.41.0 and 1.42.0's start_client_internal.py
FLOWER_IDLE_SLEEP, FLOWER_REPLY_SLEEP = "time.sleep(3)", "time.sleep(0.5)"


class _CappedTime:
    """The ``time`` module as seen by Flower's SuperNode loop module: ``sleep`` shortened.

    Flower's loop sleeps 3 s when a pull found no message, and 0.5 s between its looks for the
    ClientApp's reply. Here the idle sleep is ``hot`` within a window of ``window`` seconds after
    the node's last reply (:meth:`active`), else ``cap``; the shorter waits are ``reply``, growing
    with the ClientApp's time (``hot=0``: every sleep capped at ``cap``, the previous behaviour).

    The hot window opens at once after a reply, or, once the node has seen how long after its
    reply the next message came (the shortest of the last :data:`HOT_GAPS` such gaps), at
    :data:`HOT_LEAD` of that gap (the node sleeps until then, at most ``cap`` at a time): with 16
    parties a round's next message comes seconds after a party's reply, and a window right after
    the reply would be pulls for nothing. A gap ends when the pull that found the message began
    (:meth:`polling`, stamped by :func:`cap_idle_sleep`), not when the message was stored: the pull
    itself (0.1-0.3 s on loopback with TLS) counted in the gap moved the window later every round,
    until the node slept through 0.1-0.25 s of each round's message (docs/benchmarks.md)."""

    def __init__(self, cap: float, hot: float = 0.0):
        self.cap, self.hot, self.window, self.reply = cap, hot, HOT_WINDOW_S, REPLY_POLL_S
        self.last = -math.inf
        self.since = None           # when the current wait for a ClientApp's reply began
        self.gaps: list[float] = []  # reply -> the next message, the last HOT_GAPS times
        self.polled = None          # when the node's latest pull began (:meth:`polling`)

    def __getattr__(self, name):
        return getattr(time, name)

    def active(self) -> None:
        self.last = time.monotonic()
        self.since = None

    def polling(self) -> None:
        """A pull for the next message begins now."""
        self.polled = time.monotonic()

    def hot_start(self) -> float:
        """Seconds after a reply at which the hot window opens."""
        return HOT_LEAD * min(self.gaps) if self.gaps else 0.0

    def sleep(self, seconds):
        if not self.hot:
            s = self.cap
        elif seconds >= 3:                                       # the idle sleep
            el, start = time.monotonic() - self.last, self.hot_start()
            if el < start:                                       # sleep until the window opens
                s = min(self.cap, max(self.hot, start - el))
            else:
                s = self.hot if el < start + self.window else self.cap
        else:                                                    # waits for the ClientApp's reply
            now = time.monotonic()
            if self.since is None:                               # a message came: its first wait
                self.since = now
                if math.isfinite(self.last):                     # ... found by the pull begun at
                    came = self.polled if self.polled is not None and self.polled >= self.last else now
                    self.gaps = (self.gaps + [came - self.last])[-HOT_GAPS:]
            s = min(REPLY_POLL_CAP_S, max(self.reply, REPLY_POLL_FRACTION * (now - self.since)))
        time.sleep(min(seconds, s))


def check_idle_poll(value, name="--idle-poll", allowed=IDLE_POLL_RANGE, default=IDLE_POLL_S,
                    zero=False) -> float:
    """``value`` as a float in ``allowed`` (or 0 when ``zero``), else a ValueError naming it."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number; give seconds between "
                         f"{allowed[0]} and {allowed[1]}{' or 0' if zero else ''} (default {default})") from None
    if not (math.isfinite(v) and (allowed[0] <= v <= allowed[1] or (zero and v == 0))):
        raise ValueError(f"{name}={value!r} is out of range; give seconds between "
                         f"{allowed[0]} and {allowed[1]}{' or 0' if zero else ''} (default {default})")
    return v


def cap_idle_sleep(idle_poll: float = IDLE_POLL_S, hot_poll: float = 0.0) -> bool:
    """Shorten the sleeps of Flower's SuperNode loop module, in this process: the idle sleep to
    ``idle_poll`` seconds, or to ``hot_poll`` within :data:`HOT_WINDOW_S` after a reply was
    sent (``hot_poll=0``: every sleep capped at ``idle_poll``).

    Returns False (and warns, patch ``supernode-poll``) without patching when this Flower release
    is not one the loop was read in or its loop no longer has the sleeps this replaces.
    """
    idle_poll = check_idle_poll(idle_poll)
    hot_poll = check_idle_poll(hot_poll, "--hot-poll", HOT_POLL_RANGE, HOT_POLL_S, zero=True)
    import flwr.supernode.start_client_internal as sci

    current = getattr(sci, "time", None)
    if isinstance(current, _CappedTime):            # already patched in this process
        current.cap, current.hot = idle_poll, hot_poll
        return True
    source = inspect.getsource(sci)
    missing = [s for s in (FLOWER_IDLE_SLEEP, FLOWER_REPLY_SLEEP) if s not in source]
    if not callable(getattr(sci, "_push_messages", None)):
        missing.append("_push_messages")
    if current is not time:
        missing.append("start_client_internal.time as the time module")
    if not applicable("supernode-poll", missing):
        return False
    proxy = _CappedTime(idle_poll, hot_poll)
    push = sci._push_messages

    def _push_messages(*args, **kwargs):            # Flower's, then: a reply went out -> hot
        try:
            return push(*args, **kwargs)
        finally:
            proxy.active()

    replace("supernode-poll", sci, "time", proxy)
    replace("supernode-poll", sci, "_push_messages", _push_messages)
    pull = getattr(sci, "_pull_and_store_message", None)
    if callable(pull):
        def _pull_and_store_message(*args, **kwargs):   # when the pull that finds a message began
            proxy.polling()
            return pull(*args, **kwargs)
        replace("supernode-poll", sci, "_pull_and_store_message", _pull_and_store_message)
    return True


def wake_executor(port: int) -> bool:
    """After Flower's SuperNode loop stored a pulled message (``_pull_and_store_message``
    returned a run id), send one UDP datagram to 127.0.0.1:``port``, where this node's warm
    executor waits between its task polls (``warm_exec --wake-port``): it asks for the task at
    once instead of polling every 10 ms. Returns False (and warns, patch ``supernode-wake-executor``)
    without patching on a Flower release this was not read in; the executor then finds the task at
    its next poll (<= 1 s)."""
    import socket

    import flwr.supernode.start_client_internal as sci

    pull = getattr(sci, "_pull_and_store_message", None)
    if getattr(pull, "wake_port", None) is not None:          # already patched in this process
        pull.wake_port = int(port)
        return True
    if not applicable("supernode-wake-executor",
                      [] if callable(pull) and "_pull_and_store_message(" in inspect.getsource(sci.start_client_internal)
                      else ["_pull_and_store_message( in start_client_internal"]):
        return False
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def _pull_and_store_message(*args, **kwargs):   # Flower's, then: a message stored -> wake
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            try:
                sock.sendto(b"m", ("127.0.0.1", _pull_and_store_message.wake_port))
            except OSError:
                pass
        return run_id

    _pull_and_store_message.wake_port = int(port)
    replace("supernode-wake-executor", sci, "_pull_and_store_message", _pull_and_store_message)
    return True


#: a pulled object that is not there yet is asked for again after OBJECT_RETRY_S, doubling up to
#: OBJECT_RETRY_CAP_S (Flower: after 1 s, up to 10 s). A node creates a message's task before it
#: has pulled the message's objects, so a ClientApp started at once asks too early and, with
#: Flower's backoff, waits a whole second; the same race between a pushed message and its objects
#: on the SuperLink.
OBJECT_RETRY_S, OBJECT_RETRY_CAP_S = 0.01, 0.5


def fast_object_retries(first: float = OBJECT_RETRY_S, cap: float = OBJECT_RETRY_CAP_S) -> bool:
    """Shorten Flower's retry backoff for objects not yet available (``pull_objects`` and
    ``pull_and_inflate_object_from_tree`` in ``flwr.supercore.inflatable.inflatable_utils``), in
    this process. Returns False (and warns, patch ``object-retry-backoff``) without patching on a
    Flower release this was not read in or whose functions lack those keyword defaults."""
    from flwr.supercore.inflatable import inflatable_utils as iu

    names = ("pull_objects", "pull_and_inflate_object_from_tree")
    fns = [getattr(iu, n, None) for n in names]
    if not applicable("object-retry-backoff", [
            f"{n}(initial_backoff=, backoff_cap=)" for n, f in zip(names, fns)
            if not (callable(f) and {"initial_backoff", "backoff_cap"} <= set(f.__kwdefaults__ or {}))]):
        return False
    for f in fns:
        set_kwdefault("object-retry-backoff", f, "initial_backoff", first)
        set_kwdefault("object-retry-backoff", f, "backoff_cap", cap)
    return True


def telemetry_off_by_default() -> bool:
    """Flower's telemetry off in this process unless ``$FLWR_TELEMETRY_ENABLED`` says otherwise
    (Flower reads it once, at import: the module's copy is set too). True when off."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    tm = sys.modules.get("flwr.supercore.telemetry")
    if tm is not None and hasattr(tm, "FLWR_TELEMETRY_ENABLED") and \
            tm.FLWR_TELEMETRY_ENABLED != os.environ["FLWR_TELEMETRY_ENABLED"] and applicable("telemetry-off"):
        replace("telemetry-off", tm, "FLWR_TELEMETRY_ENABLED", os.environ["FLWR_TELEMETRY_ENABLED"])
    return os.environ["FLWR_TELEMETRY_ENABLED"] != "1"


#: a SuperLink refuses to activate a node whose previous session is still ONLINE (code 2004, "Failed
#: to activate SuperNode") until it misses two heartbeats (2 x 30 s) after a kill; the node asks
#: again every ACTIVATION_RETRY_S for up to ACTIVATION_WINDOW_S (Flower: exits at once, code 305)
ACTIVATION_RETRY_S, ACTIVATION_WINDOW_S = 3.0, 65.0
#: Flower's code for that refusal (flwr.supercore.error.base.ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED)
ACTIVATION_REFUSED = 2004
FLOWER_ACTIVATE_CALL = "client.ActivateNode,"


def retry_activation(every: float = ACTIVATION_RETRY_S, window: float = ACTIVATION_WINDOW_S,
                     sleep=time.sleep, clock=time.monotonic) -> bool:
    """A refused activation (code 2004: the node's previous session is still online at the SuperLink)
    is asked again every ``every`` seconds for up to ``window`` seconds, with one log line saying
    why; then Flower's own error (the SuperNode exits as Flower does). Every other answer is
    Flower's. Returns False (and warns, patch ``activation-retry``) without patching on a Flower
    release this was not read in."""
    import flwr.supernode.fleet_http_connection as conn
    from flwr.supernode.fleet_http_client import FleetHttpClient

    try:
        import httpx
        from flwr.supercore.error import FlowerError
        from flwr.supercore.error.base import ApiErrorCode
        missing = [FLOWER_ACTIVATE_CALL if FLOWER_ACTIVATE_CALL not in inspect.getsource(conn) else "",
                   "" if callable(getattr(FleetHttpClient, "ActivateNode", None)) else "FleetHttpClient.ActivateNode",
                   "" if callable(getattr(FlowerError, "from_json", None)) else "FlowerError.from_json",
                   "" if getattr(ApiErrorCode, "FLEET_NODE_ACTIVATION_FAILED", None) == ACTIVATION_REFUSED
                   else f"ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED={ACTIVATION_REFUSED}"]
    except (ImportError, OSError, TypeError) as exc:
        missing = [f"the activation code ({type(exc).__name__})"]
    if not applicable("activation-retry", missing):
        return False
    current = FleetHttpClient.ActivateNode
    flower = getattr(current, "_flower_vfl_activate", current)

    def ActivateNode(self, request):
        t0, told = clock(), False
        while True:
            try:
                return flower(self, request)
            except httpx.HTTPStatusError as exc:
                err = FlowerError.from_json(exc.response.text)
                if err is None or err.code != ACTIVATION_REFUSED or clock() - t0 + every > window:
                    raise
                if not told:
                    from logging import WARNING

                    from flwr.supercore import log
                    log(WARNING, "flower-vfl-supernode: the SuperLink refused to activate this node ([code: %d] "
                        "%s): its previous session is still online until the SuperLink misses its heartbeats "
                        "(up to 60 s after a kill); asking again every %g s for up to %g s",
                        err.code, err.message, every, window)
                    told = True
                sleep(every)

    ActivateNode._flower_vfl_activate = flower
    replace("activation-retry", FleetHttpClient, "ActivateNode", ActivateNode)
    return True


#: a probe of the SuperLink's address (one TLS handshake, no certificate check) gives up after this
PROBE_TIMEOUT_S = 3.0
#: probes per connection at most (one that reached the server and got an answer ends the probing)
MAX_PROBES = 2
#: a node whose SuperLink was found to speak the other protocol exits after this many failed attempts
#: (Flower: retries forever); the hint is logged at the first
MISMATCH_EXIT_AFTER = 3
#: what the patch wraps, read in flwr 1.41.0 and 1.42.0's fleet_http_connection.py
FLOWER_RETRY_CALL = "make_simple_http_retry_invoker()"
TLS_HINT = ("flower-vfl-supernode: the SuperLink at {address} speaks TLS but this node runs with --insecure; "
            "start it with --root-certificates <the CA file> instead of --insecure")
PLAIN_HINT = ("flower-vfl-supernode: the SuperLink at {address} does not speak TLS but this node connects with TLS; "
              "start it with --insecure, or start the SuperLink with "
              "--ssl-ca-certfile, --ssl-certfile and --ssl-keyfile")


class TLSMismatchError(RuntimeError):
    """The node and its SuperLink disagree on TLS: retrying cannot help."""


def probe_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """Does the server at ``host:port`` speak TLS? One handshake, no certificate verification.

    True: a handshake completed, or the server answered with a TLS alert (it wants a client
    certificate, say); False: it took the connection and answered bytes that are not TLS (a plain
    HTTP or gRPC server); None: unknown (refused, unreachable, silent, or closed without a word).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    try:
        with ctx.wrap_socket(sock, server_hostname=host):
            return True
    except ssl.SSLError as exc:
        if "ALERT" in str(exc.reason or exc).upper():
            return True
        if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return None
        return False              # WRONG_VERSION_NUMBER & co: plain bytes where a TLS record was due
    except OSError:
        return None
    finally:
        sock.close()


def mismatch_hint(address: str, insecure: bool, speaks_tls: bool | None) -> str | None:
    """The line telling the user which flag to change, or None when the probe found no mismatch."""
    if speaks_tls is None or speaks_tls != insecure:
        return None
    return (TLS_HINT if insecure else PLAIN_HINT).format(address=address)


def _worth_probing(exc) -> bool:
    """A failure a TLS mismatch can cause: the server took the connection and the exchange broke
    (plain text to a TLS server), or the TLS handshake failed (TLS to a plain server). Not a refused
    or timed-out connect (nothing listens yet), nor an HTTP answer (the protocols agree)."""
    import httpx

    if not isinstance(exc, httpx.TransportError) or isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
        return False
    if isinstance(exc, httpx.ConnectError):
        return any(t in str(exc).lower() for t in ("ssl", "tls", "wrong version", "record layer"))
    return True


class _TLSDiagnosis:
    """Watches the failures of one of Flower's retry invokers (one SuperNode connection): at the
    first that a TLS mismatch can cause it probes the SuperLink (:func:`probe_tls`, at most
    ``max_probes`` times until one answers) and logs :func:`mismatch_hint` once; while the node has
    never connected, the ``exit_after``-th failed attempt counted from the hint's raises
    :class:`TLSMismatchError` (Flower then exits with code 305 and its message)."""

    def __init__(self, probe=probe_tls, exit_after: int = MISMATCH_EXIT_AFTER, max_probes: int = MAX_PROBES):
        self.probe, self.exit_after, self.max_probes = probe, exit_after, max_probes
        self.probes = self.failures = 0
        self.answered = self.connected = False
        self.hint: str | None = None

    def attach(self, invoker):
        """Wrap ``invoker``'s callbacks (Flower's run first); an invoker without them is left as is."""
        if not all(hasattr(invoker, a) for a in ("on_success", "on_backoff", "on_giveup")):
            return invoker
        success, backoff, giveup = invoker.on_success, invoker.on_backoff, invoker.on_giveup

        def on_success(state):
            self.connected = True
            if success is not None:
                success(state)

        def on_backoff(state):
            if backoff is not None:
                backoff(state)
            self.failed(state.exception, may_exit=True)

        def on_giveup(state):           # Flower gives up at once on a TLS handshake error
            self.failed(state.exception, may_exit=False)
            if giveup is not None:
                giveup(state)

        invoker.on_success, invoker.on_backoff, invoker.on_giveup = on_success, on_backoff, on_giveup
        return invoker

    def failed(self, exc, may_exit: bool) -> None:
        if not self.answered and self.probes < self.max_probes and _worth_probing(exc):
            try:
                url = exc.request.url
            except (AttributeError, RuntimeError):      # httpx: a request error without its request
                return
            port = url.port or (443 if url.scheme == "https" else 80)
            address = f"[{url.host}]:{port}" if ":" in url.host else f"{url.host}:{port}"
            self.probes += 1
            speaks_tls = self.probe(url.host, port)
            self.answered = speaks_tls is not None
            self.hint = mismatch_hint(address, url.scheme == "http", speaks_tls)
            if self.hint:
                from logging import ERROR

                from flwr.supercore import log
                log(ERROR, "%s", self.hint)
        self.failures += self.hint is not None          # failed attempts since the hint
        if may_exit and self.hint and not self.connected and self.failures >= self.exit_after:
            raise TLSMismatchError(f"{self.hint} (gave up after {self.failures} failed attempts)")


def hint_tls_mismatch(probe=probe_tls, exit_after: int = MISMATCH_EXIT_AFTER) -> bool:
    """Every retry invoker of the node's SuperLink connection (``make_simple_http_retry_invoker``
    as ``flwr.supernode.fleet_http_connection`` calls it) gets a :class:`_TLSDiagnosis`, in this
    process. Returns False (and warns, patch ``tls-mismatch-hint``) without patching on a Flower
    release this was not read in."""
    import flwr.supernode.fleet_http_connection as conn

    make = getattr(conn, "make_simple_http_retry_invoker", None)
    try:
        found = callable(make) and FLOWER_RETRY_CALL in inspect.getsource(conn)
    except (OSError, TypeError):
        found = False
    if not applicable("tls-mismatch-hint", [] if found else [FLOWER_RETRY_CALL]):
        return False
    flower = getattr(make, "_flower_vfl_make", make)

    def make_simple_http_retry_invoker(*args, **kwargs):
        return _TLSDiagnosis(probe, exit_after).attach(flower(*args, **kwargs))

    make_simple_http_retry_invoker._flower_vfl_make = flower
    replace("tls-mismatch-hint", conn, "make_simple_http_retry_invoker", make_simple_http_retry_invoker)
    return True


#: the heartbeat intervals a SuperLink accepts (flwr.common.constant.HEARTBEAT_MIN/MAX_INTERVAL)
#: and Flower's own (HEARTBEAT_DEFAULT_INTERVAL), read in flwr 1.41.0 and 1.42.0
HEARTBEAT_RANGE, FLOWER_HEARTBEAT_S = (10.0, 1800.0), 30
#: the modules whose copy of HEARTBEAT_DEFAULT_INTERVAL the node announces and paces itself by
HEARTBEAT_MODULES = ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")


def check_heartbeat(value) -> float:
    """``--heartbeat`` as seconds within the SuperLink's accepted range, or a ValueError naming it."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    lo, hi = HEARTBEAT_RANGE
    if not lo <= v <= hi:
        raise ValueError(f"--heartbeat={value!r}: seconds between heartbeats must be in [{lo:g}, {hi:g}] (the "
                         f"SuperLink refuses others); leave it out for Flower's {FLOWER_HEARTBEAT_S} s")
    return v


def set_heartbeat(seconds: float) -> bool:
    """The node announces (and keeps) a heartbeat every ``seconds`` (Flower: 30), in this process.
    Returns False (and warns, patch ``heartbeat-interval``, leaving Flower's) on a Flower release
    this was not read in."""
    import importlib

    seconds = check_heartbeat(seconds)
    try:
        mods = [importlib.import_module(m) for m in HEARTBEAT_MODULES]
    except ImportError:
        mods = []
    missing = [f"{m.__name__}.HEARTBEAT_DEFAULT_INTERVAL={FLOWER_HEARTBEAT_S}" for m in mods
               if getattr(m, "HEARTBEAT_DEFAULT_INTERVAL", None) not in (FLOWER_HEARTBEAT_S, seconds)]
    if not applicable("heartbeat-interval", missing if mods else [", ".join(HEARTBEAT_MODULES)]):
        return False
    for m in mods:
        replace("heartbeat-interval", m, "HEARTBEAT_DEFAULT_INTERVAL", seconds)
    return True


def _split_args(argv: list[str]) -> tuple[float, float, float | None, list[str]]:
    """(--idle-poll, --hot-poll, --heartbeat or None, the rest for flower-supernode, in order);
    ``--wake-executor`` is taken by :func:`_wake_arg` first."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ap.add_argument("--idle-poll", default=IDLE_POLL_S)
    ap.add_argument("--hot-poll", default=HOT_POLL_S)
    ap.add_argument("--heartbeat", default=None)
    try:
        ns, rest = ap.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        flag = next((f for f in ("--hot-poll", "--heartbeat") if f[2:] in str(exc)), "--idle-poll")
        default = {"--hot-poll": HOT_POLL_S, "--idle-poll": IDLE_POLL_S}.get(flag, f"Flower's {FLOWER_HEARTBEAT_S}")
        raise ValueError(f"{flag} needs a value in seconds (default {default})") from None
    return (check_idle_poll(ns.idle_poll),
            check_idle_poll(ns.hot_poll, "--hot-poll", HOT_POLL_RANGE, HOT_POLL_S, zero=True),
            None if ns.heartbeat is None else check_heartbeat(ns.heartbeat), rest)


def _wake_arg(argv: list[str]) -> tuple[int | None, list[str]]:
    """(--wake-executor PORT or None, the other arguments)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ap.add_argument("--wake-executor", default=None)
    try:
        ns, rest = ap.parse_known_args(argv)
        port = None if ns.wake_executor is None else int(ns.wake_executor)
    except (argparse.ArgumentError, ValueError):
        raise ValueError("--wake-executor needs a UDP port on 127.0.0.1 (the warm executor's --wake-port)") from None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"--wake-executor={port} is not a port number")
    return port, rest


def main(argv: list[str] | None = None) -> int | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(f"flower-vfl-supernode [--idle-poll SECONDS] [--hot-poll SECONDS] [--heartbeat SECONDS] "
              f"<flower-supernode arguments>\n\n"
              f"  --idle-poll  seconds an idle SuperNode waits between pulls (default {IDLE_POLL_S}; "
              f"Flower's own: 3)\n"
              f"  --hot-poll   seconds between pulls for {HOT_WINDOW_S:g} s after the node sent a reply, and "
              f"between its looks for the ClientApp's reply {REPLY_POLL_S:g} s (default {HOT_POLL_S}; "
              f"0: off)\n"
              f"  --heartbeat  seconds between the node's heartbeats (default: Flower's {FLOWER_HEARTBEAT_S}; "
              f"{HEARTBEAT_RANGE[0]:g}..{HEARTBEAT_RANGE[1]:g}); the SuperLink takes a node for gone 2 of them "
              f"after its last\n"
              f"  --wake-executor PORT  send a UDP datagram to 127.0.0.1:PORT when a message was stored (the warm "
              f"executor's --wake-port: it asks for the task at once, without polling)"
              f"\n\nflower-supernode's arguments follow:\n")
    try:
        wake, argv = _wake_arg(argv)
        idle, hot, heartbeat, rest = _split_args(argv)
    except ValueError as exc:
        print(f"flower-vfl-supernode: {exc}", file=sys.stderr)
        return 2
    telemetry_off_by_default()       # inherited by the ClientApp processes the node starts
    retry_activation()
    hint_tls_mismatch()
    if heartbeat is not None:
        set_heartbeat(heartbeat)
    cap_idle_sleep(idle, hot)
    if wake is not None:
        wake_executor(wake)
    if hot:
        fast_object_retries()
    serve_installed_fabs()           # a forked ClientApp that installed the run's FAB gets it without content
    for observe in hooks.NODE_START:      # empty in the product (benchmarks/timing/ adds its timing)
        observe()
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
