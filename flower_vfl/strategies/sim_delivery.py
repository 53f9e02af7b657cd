"""In Flower's simulation, hand a pushed round to the ClientApps now, not on the next 0.1 s tick.

Flower's simulation engine (flwr 1.41 / 1.42, ``flwr.server.superlink.fleet.vce.vce_api``) runs
the ServerApp in a thread of the same process as the engine. One engine thread,
``add_messages_to_queue``, moves the messages the ServerApp pushed into its workers' queue, then
sleeps ``f_stop.wait(0.1)``: a message pushed just after a scan waits up to 0.1 s before any
ClientApp sees it, and a round whose central step ends just after a tick loses most of one.

:func:`wake_delivery` (called by :func:`~flower_vfl.strategies.exchange.send_and_receive` right
after it pushed to Flower's ``InMemoryGrid``) finds that thread among this process's threads
(its target *is* Flower's ``add_messages_to_queue``), takes the ``threading.Event`` it sleeps
on, and notifies the Event's condition: the thread wakes and scans at once. The Event's flag is
not touched (``f_stop.is_set()`` stays False, so the loop goes on; the loop ignores what
``wait`` returns, and it is the only waiter on that Event in these releases). Nothing is
delivered that Flower would not deliver on its next tick; only the wait goes.

On another Flower release, or where that loop's source no longer sleeps on ``f_stop.wait(``, the
wake is skipped and :func:`warn_if_absent` says so once (rounds then wait for Flower's
tick, as before): the patch ``sim-delivery-wake`` of :mod:`flower_vfl.flower_patches`, whose one
version check and warning this uses.

Why the thread's private attributes (``Thread._target`` / ``_args`` / ``_kwargs``, ``Event._cond``):
no public API does this. ``threading.Event`` has no way to wake a waiter without setting its flag
(``set()`` would end Flower's loop: it runs ``while not f_stop.is_set()``), and ``threading.Thread``
does not expose what it runs. The one alternative, replacing ``vce_api.add_messages_to_queue``
with a loop that sleeps on something we can wake, only works if the replacement is in place before
the engine starts that thread; the ServerApp (our code) is loaded in a thread of the same process
while the engine starts, so that would race it. Reading a running thread is read-only: on any
doubt (another release, another loop, no such thread) nothing is touched.

``$FLOWER_VFL_SIM_WAKE=0`` turns it off (benchmarks: the same run measured with and without).
The central node's process only: a party's code is not touched.
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings

from flower_vfl.flower_patches import applicable, known_release

#: the entry of :data:`flower_vfl.flower_patches.PATCHES` this is
PATCH = "sim-delivery-wake"
#: "0": do not wake Flower's delivery thread (benchmarks)
ENV = "FLOWER_VFL_SIM_WAKE"
#: what the loop must sleep on for the wake to apply
LOOP_SLEEP = "f_stop.wait("
#: Flower's tick; the exchange wakes the thread again at each of its pulls within one tick of the
#: push while no reply came (a wake that lands while the thread is scanning is lost)
TICK_S = 0.1

_CONDITION = type(threading.Condition())
_found: dict = {"thread": None, "event": None, "usable": None, "warned": False, "woken": 0}


def _missing() -> list[str]:
    """What Flower's delivery loop lacks of the one this was read in (empty: it is that loop)."""
    try:
        from flwr.server.superlink.fleet.vce import vce_api
        cand = getattr(vce_api, "add_messages_to_queue", None)
        if callable(cand) and LOOP_SLEEP in inspect.getsource(cand) \
                and list(inspect.signature(cand).parameters)[3:4] == ["f_stop"]:
            return []
    except Exception:                   # no simulation extra, or a source that cannot be read
        pass
    return ["vce_api.add_messages_to_queue(state, queue, nodes_mapping, f_stop) sleeping on f_stop.wait"]


def _usable():
    """Flower's delivery loop function when this release's loop is the one read, else None."""
    if _found["usable"] is None:
        fn = None
        if known_release(name=PATCH) and not _missing():
            from flwr.server.superlink.fleet.vce import vce_api
            fn = vce_api.add_messages_to_queue
        _found["usable"] = fn or False
    return _found["usable"] or None


def _delivery_event():
    """The Event Flower's running delivery thread sleeps on (None: no such thread here)."""
    th = _found["thread"]
    if th is not None and th.is_alive() and not _found["event"].is_set():
        return _found["event"]
    target = _usable()
    if target is None:
        return None
    for th in threading.enumerate():
        if getattr(th, "_target", None) is not target:
            continue
        args, kwargs = getattr(th, "_args", ()), getattr(th, "_kwargs", {}) or {}
        ev = kwargs.get("f_stop", args[3] if len(args) > 3 else None)
        if isinstance(ev, threading.Event) and isinstance(getattr(ev, "_cond", None), _CONDITION) \
                and not ev.is_set():
            _found["thread"], _found["event"] = th, ev
            return ev
    return None


def _off() -> bool:
    """``$FLOWER_VFL_SIM_WAKE`` is "0" (off) or "1"/unset (on); any other value warns once and the
    wake stays on (a benchmark's switch: a typo must not pass for a measured "off")."""
    value = os.environ.get(ENV, "1")
    if value not in ("0", "1") and not _found.get("env_warned"):
        _found["env_warned"] = True
        warnings.warn(f"flower-vfl: ${ENV}={value!r} is not 0 or 1; the simulation delivery wake stays on "
                      f"(set {ENV}=0 to turn it off)", stacklevel=3)
    return value == "0"


def wake_delivery() -> bool:
    """Wake Flower's simulation delivery thread in this process so that it scans for the
    messages just pushed. True when it was woken; False when off, absent or not this release's."""
    if _off():
        return False
    ev = _delivery_event()
    if ev is None:
        return False
    with ev._cond:                      # the flag stays as it is: the loop wakes and goes on
        ev._cond.notify_all()
    _found["woken"] += 1
    return True


def warn_if_absent() -> None:
    """Once, after an exchange on Flower's in-memory grid got replies (so the engine's delivery
    thread is running: the first exchange's push can come before the engine started it), say so
    when that thread cannot be found to be woken."""
    if _found["warned"] or _off() or _delivery_event() is not None:
        return
    _found["warned"] = True
    if _usable() is None:                # one line naming the patch and the Flower version
        applicable(PATCH, _missing(), stacklevel=2)
        return
    import flwr
    version = getattr(flwr, "__version__", "?")
    warnings.warn(f"flower-vfl: no thread running Flower's simulation delivery loop (flwr {version}, "
                  "vce_api.add_messages_to_queue) was found in the ServerApp's process; each round waits for "
                  "Flower's 0.1 s delivery tick", stacklevel=2)
