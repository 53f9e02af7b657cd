"""``flower-vfl-supernode``: Flower's ``flower-supernode`` with a shorter idle poll (flwr 1.41/1.42).

Flower's SuperNode loop (``flwr/supernode/start_client_internal.py``) pulls the SuperLink for a
message and, when there is none, sleeps a hard-coded **3 s** (no flag, no environment variable).
In a round of vertical ADMM every party replies and then waits for the next round's message, so
every round pays most of that sleep: on loopback, a9a with 2 parties, ~3.7 s per round with the
warm executor against ~1.8 s when the sleep is 0.5 s (docs/benchmarks.md, "Latency of a round on
real SuperNodes").

This runs Flower's own ``flower-supernode`` entry point, unchanged in every argument and
behaviour, except that the sleeps *inside that one module* are capped at ``--idle-poll`` seconds
(the 3 s idle sleep; the module's 0.5 s waits for a ClientApp's reply are capped only if the poll
is shorter). An idle SuperNode then asks the SuperLink for a message ``1/idle-poll`` times a
second instead of once every 3 s — one small gRPC request.

    flower-vfl-supernode --idle-poll 0.5 --superlink link.example.org:9092 \\
        --root-certificates ca.crt --node-config "partition-id=1 data-path='...'"

The patch checks that Flower's loop still has the sleep it replaces; if a Flower release changes
it, the SuperNode runs as Flower ships it and says so in one warning line.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
import warnings

__all__ = ["IDLE_POLL_S", "cap_idle_sleep", "main"]

#: default idle poll of ``flower-vfl-supernode`` and of ``flower-vfl deploy-local`` (seconds)
IDLE_POLL_S = 0.5
#: the range accepted for ``--idle-poll`` (below 0.05 s an idle node is ~20 requests a second;
#: above 3 s is slower than Flower's own loop)
IDLE_POLL_RANGE = (0.05, 3.0)
#: what the patch replaces, read in flwr 1.41.0's start_client_internal.py
FLOWER_IDLE_SLEEP = "time.sleep(3)"


class _CappedTime:
    """The ``time`` module as seen by Flower's SuperNode loop module: ``sleep`` capped."""

    def __init__(self, cap: float):
        self.cap = cap

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        time.sleep(min(seconds, self.cap))


def check_idle_poll(value) -> float:
    """``--idle-poll`` as a float in :data:`IDLE_POLL_RANGE`, else a ValueError naming it."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--idle-poll={value!r} is not a number; give seconds between "
                         f"{IDLE_POLL_RANGE[0]} and {IDLE_POLL_RANGE[1]} (default {IDLE_POLL_S})") from None
    if not (math.isfinite(v) and IDLE_POLL_RANGE[0] <= v <= IDLE_POLL_RANGE[1]):
        raise ValueError(f"--idle-poll={value!r} is out of range; give seconds between "
                         f"{IDLE_POLL_RANGE[0]} and {IDLE_POLL_RANGE[1]} (default {IDLE_POLL_S})")
    return v


def cap_idle_sleep(idle_poll: float = IDLE_POLL_S) -> bool:
    """Cap the sleeps of Flower's SuperNode loop module at ``idle_poll`` seconds, in this process.

    Returns False (and warns) without patching when Flower's loop no longer has the hard-coded
    idle sleep this replaces.
    """
    idle_poll = check_idle_poll(idle_poll)
    import flwr.supernode.start_client_internal as sci

    current = getattr(sci, "time", None)
    if isinstance(current, _CappedTime):            # already patched in this process
        current.cap = idle_poll
        return True
    if current is not time or FLOWER_IDLE_SLEEP not in inspect.getsource(sci):
        warnings.warn("flower-vfl-supernode: this Flower release's SuperNode loop has no "
                      f"'{FLOWER_IDLE_SLEEP}'; running it unpatched (Flower's own idle poll)", stacklevel=2)
        return False
    sci.time = _CappedTime(idle_poll)
    return True


def _split_args(argv: list[str]) -> tuple[float, list[str]]:
    """(--idle-poll, the rest for flower-supernode, in order)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ap.add_argument("--idle-poll", default=IDLE_POLL_S)
    try:
        ns, rest = ap.parse_known_args(argv)
    except argparse.ArgumentError:
        raise ValueError(f"--idle-poll needs a value in seconds (default {IDLE_POLL_S})") from None
    return check_idle_poll(ns.idle_poll), rest


def main(argv: list[str] | None = None) -> int | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(f"flower-vfl-supernode [--idle-poll SECONDS] <flower-supernode arguments>\n\n"
              f"  --idle-poll  seconds an idle SuperNode waits between pulls (default {IDLE_POLL_S}; "
              f"Flower's own: 3)\n\nflower-supernode's arguments follow:\n")
    try:
        idle, rest = _split_args(argv)
    except ValueError as exc:
        print(f"flower-vfl-supernode: {exc}", file=sys.stderr)
        return 2
    cap_idle_sleep(idle)
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
