"""Seconds and bytes per ADMM round with the central node and each party on its own network
namespace ("host"), over plain links and WAN-like links (issue 23 item 4).

The hosts and the deployment are tests/_netns.py's, the ones tests/test_netns_hosts.py runs:
the SuperLink (TLS, node authentication) in one namespace at 10.23.0.1, one SuperNode (+ warm
executor) per party in its own namespace with its own key, folder and state-dir, a
point-to-point link each. ONE deployment serves every WAN setting, one run after the other:

- links ``wan`` (TUN device at each end + a user-space relay process): the relay delays every
  IP packet by ``delay`` ms in each direction and drops each with probability ``loss`` in each
  direction; the kernel's ``tbf`` qdisc limits the rate on every TUN device (both ends); the
  setting changes at run time between runs (:meth:`_netns.Hosts.set_link`). This kernel has no
  ``netem``, hence the relay. ``plain`` = the relay with 0 ms, 0 %, no rate limit;
- with ``--veth``, a second deployment over veth pairs (the kernel's own path, no relay).

Per setting: one a9a run (paper split, 2 parties, ``--rounds`` rounds, ``tol`` 0); before it,
``--idle-s`` seconds with the SuperNodes connected and no run (their polling traffic). Per round
(medians over rounds 2..R; submission, identify and round 1 excluded): wall seconds between
the rounds' entries in report.json, and bytes / IP packets through the links from the link
counters at the central node's end (both parties; up = party -> central node, down = the
other way). Bytes are IP packets on TUN devices and Ethernet frames on veth (14 bytes more a
packet). ``max_dev`` = max |decision_test - the first run's| (the setting must not change the
model). Results: ``benchmarks/results/netns.csv`` (one row per setting), printed as a table.

    python -W ignore benchmarks/bench_netns.py --rounds 6 --idle-s 20 --veth

Needs root, ``ip``, ``tc``, /dev/net/tun and a9a in ../shared/data/a9a. Every namespace has a
random suffix and is deleted at the end; every process is stopped by its process group.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _netns as N  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: (name, delay ms each way, loss each way, tbf rate)
SETTINGS = [("plain", 0, 0.0, None), ("10ms-100mbit", 10, 0.0, "100mbit"), ("10ms-1%-100mbit", 10, 0.01, "100mbit"),
            ("50ms-20mbit", 50, 0.0, "20mbit"), ("50ms-1%-20mbit", 50, 0.01, "20mbit")]
COLUMNS = ["link", "delay_ms", "loss", "rate", "rounds_measured", "s_per_round", "kB_per_round",
           "kB_up_per_round", "kB_down_per_round", "packets_per_round", "idle_B_per_s", "idle_packets_per_s",
           "relay_dropped_pct", "run_wall_s", "max_dev", "load1"]


def per_round(res, first=2) -> dict:
    """Medians over rounds ``first``..R of the differences between the snapshots taken when
    report.json gained a round (seconds, bytes up/down, packets; both parties)."""
    rows = []
    for k, t, cs in res["snapshots"]:
        if isinstance(k, int) and k >= first - 1:
            rows.append((k, t, sum(c["rx_bytes"] for c in cs.values()), sum(c["tx_bytes"] for c in cs.values()),
                         sum(c["rx_packets"] + c["tx_packets"] for c in cs.values())))
    d = [tuple(y - x for x, y in zip(a[1:], b[1:])) for a, b in zip(rows, rows[1:]) if b[0] == a[0] + 1]
    if not d:
        return {"rounds_measured": 0}
    med = [statistics.median(col) for col in zip(*d)]
    return {"rounds_measured": len(d), "s_per_round": med[0], "kB_up_per_round": med[1] / 1e3,
            "kB_down_per_round": med[2] / 1e3, "kB_per_round": (med[1] + med[2]) / 1e3, "packets_per_round": med[3]}


def idle(res, idle_s) -> dict:
    snaps = {k: (t, cs) for k, t, cs in res["snapshots"] if k in (-1, 0)}
    if -1 not in snaps:
        return {}
    (t0, a), (t1, b) = snaps[-1], snaps[0]
    dt = t1 - t0
    tot = lambda cs, key: sum(c[f"rx_{key}"] + c[f"tx_{key}"] for c in cs.values())  # noqa: E731
    return {"idle_B_per_s": (tot(b, "bytes") - tot(a, "bytes")) / dt,
            "idle_packets_per_s": (tot(b, "packets") - tot(a, "packets")) / dt}


def measure(kind, settings, args, work, first_decision):
    rows = []
    hosts = N.Hosts(2, kind=kind, log_dir=work)
    try:
        with N.Deployment(work / f"deploy-{kind}", hosts, args.data_dir) as dep:
            for i, (name, delay, loss, rate) in enumerate(settings):
                period = hosts.set_link(delay_ms=delay, loss=loss, rate=rate) if kind == "wan" else None
                if period is not None and rows:
                    rows[-1]["relay_dropped_pct"] = 100 * period["dropped"] / max(1, period["forwarded"]
                                                                                  + period["dropped"])
                print(f"[{time.strftime('%H:%M:%S')}] {kind} {name}: run of {args.rounds} rounds", flush=True)
                res = dep.run({"dataset": "a9a", "num-parties": 2, "max-rounds": args.rounds}, f"{i}-{name}",
                              timeout=3600, idle_s=args.idle_s)
                if res["record"]["status"] != "finished:completed":
                    raise RuntimeError(f"{kind} {name}: run ended {res['record']['status']}; see {res['logs']}")
                f = np.load(res["out_dir"] / "decision_test.npy")
                if first_decision[0] is None:
                    first_decision[0] = f
                row = {"link": name if kind == "wan" else "veth", "delay_ms": delay, "loss": loss,
                       "rate": rate or "", **per_round(res), **idle(res, args.idle_s),
                       "run_wall_s": res["wall_s"], "max_dev": float(np.max(np.abs(f - first_decision[0]))),
                       "load1": os.getloadavg()[0]}
                rows.append(row)
                print("   " + "  ".join(f"{k}={_fmt(row.get(k))}" for k in COLUMNS[4:]), flush=True)
    finally:
        hosts.close()
    if kind == "wan" and rows and hosts.periods:
        last = hosts.periods[-1]
        rows[-1]["relay_dropped_pct"] = 100 * last["dropped"] / max(1, last["forwarded"] + last["dropped"])
    if hosts.left():
        raise RuntimeError(f"namespaces left behind: {hosts.left()}")
    return rows


def _fmt(v):
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(N.a9a_dir() or "../shared/data/a9a"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--settings", default=",".join(s[0] for s in SETTINGS),
                    help="comma-separated names among: " + ", ".join(s[0] for s in SETTINGS)
                    + " (repeat names to interleave settings against the machine's load)")
    ap.add_argument("--veth", action="store_true", help="also one run over veth pairs (own deployment)")
    ap.add_argument("--out", default=str(RESULTS / "netns.csv"))
    args = ap.parse_args(argv)
    why = N.unavailable()
    if why:
        sys.exit(f"cannot run here: {why}")
    if args.rounds < 3:
        sys.exit(f"--rounds {args.rounds}: need at least 3 (rounds 2..R are measured)")
    known = {s[0]: s for s in SETTINGS}
    unknown = [n for n in args.settings.split(",") if n and n not in known]
    if unknown:
        sys.exit(f"--settings: unknown {unknown}; choose among {list(known)}")
    chosen = [known[n] for n in args.settings.split(",") if n]
    t0 = time.monotonic()
    first = [None]
    with tempfile.TemporaryDirectory(prefix="bench-netns-") as tmp:
        rows = measure("wan", chosen, args, Path(tmp), first)
        if args.veth:
            rows += measure("veth", [("veth", 0, 0.0, None)], args, Path(tmp), first)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in COLUMNS})
    print(f"\n# python benchmarks/bench_netns.py {' '.join(argv if argv is not None else sys.argv[1:])}"
          f"  ({time.monotonic() - t0:.0f} s; {os.cpu_count()} cores)")
    shown = ["link", "s_per_round", "kB_per_round", "kB_up_per_round", "kB_down_per_round", "packets_per_round",
             "idle_B_per_s", "relay_dropped_pct", "max_dev", "load1"]
    print(" | ".join(shown))
    for r in rows:
        print(" | ".join(_fmt(r.get(k)) for k in shown))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
