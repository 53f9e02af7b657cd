"""A round of the engine against its two products per party, and where the rest goes.

For each set, ``--fits`` fits of :class:`flower_vfl.VerticalADMM` (default options, ``tol`` 0, a
fixed number of rounds) under one BLAS/OpenMP thread (threadpoolctl), alternated with timings of
"the products": for every party one ``D_m @ x_m`` and one ``D_m.T @ v`` (v an N-vector, or N x K
for the multinomial set), the two mat-vecs any x-update that releases ``D_m x_m`` does. Both are CPU time of the thread
(``time.thread_time``: what a loaded machine's waiting for a core does not inflate): a round = the
round driver's ``_round`` over rounds 2..R (round 1 factorizes) / (R - 1), the products the median
of 20 repetitions after each fit; the wall-clock median round (``history_``'s ``elapsed_s``) is
printed beside it.

``--split`` also times the round's parts by wrapping the methods the round driver calls (a few
microseconds of overhead a round): the parties' x-updates (products included), the sum of the
releases, the central z/y-update, the objective row (``loss.mean`` and the parties' penalties),
the accelerator, the rest (the driver's bookkeeping).

    python benchmarks/bench_round_split.py --sets a9a,sparse,digits --fits 5 --split

Two trees side by side: ``--trees OLD,NEW --pairs 3`` runs this script on each tree in turn
(``PYTHONPATH=<tree>``, a fresh process each, the order alternated from pair to pair) and prints
every run's round, products and ratio, and the ratio NEW round / OLD round of each pair (e.g. a
checkout of HEAD, ``git archive HEAD | tar -x -C /tmp/head``, against the working tree).

    python benchmarks/bench_round_split.py --sets a9a --fits 3 --split --trees /tmp/head,. --pairs 3

Sets: ``a9a`` (paper split, lam 1e-4, 17 rounds), ``sparse`` (benchmarks/_synth.py
sparse_binary, 1M x (100, 200, 300), lam 1e-4, 30 rounds; ``--sparse-rows``), ``digits``
(scikit-learn's digits / 16, 2 x 32 columns, multinomial K = 10, lam 1e-4, 89 rounds).
``--rounds`` overrides every set's count. ``--stall TAU|off`` sets
``flower_vfl.core.accel.STALL_RATIO`` (Anderson once the plain rounds stall; default: the
module's). Writes benchmarks/results/bench_round_split.json (``--out``). Load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np

import _common as C

#: CPU seconds of this thread: a round's and the products' own time, not the time waiting for a
#: core on a loaded machine
CLOCK = time.thread_time
import _synth


def load(name, sparse_rows):
    if name == "a9a":
        tr, y = C.load_a9a()[:2]
        return dict(blocks=tr, y=y, kw=dict(lam=1e-4), rounds=17)
    if name == "sparse":
        B, y = _synth.sparse_binary(n_rows=sparse_rows)
        return dict(blocks=B, y=y, kw=dict(lam=1e-4), rounds=30)
    if name == "digits":
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        return dict(blocks=[np.ascontiguousarray(X[:, :32]), np.ascontiguousarray(X[:, 32:])], y=y,
                    kw=dict(lam=1e-4, loss="multinomial"), rounds=89)
    raise ValueError(f"unknown set {name!r}")


class Split:
    """Wrap the round's methods with timers (class attributes, restored by :meth:`close`)."""

    def __init__(self, parts=True):
        from flower_vfl.core import accel, central, losses, party, rounds
        self.t = defaultdict(float)
        self.saved = []
        self.k = 0                       # rounds begun: round 1 (factorizations) is not counted
        wrap = self._wrap
        wrap(rounds.RoundDriver, "_round", "round", count=True)
        if not parts:
            return
        wrap(party.PartyUpdate, "step", "x-updates")
        wrap(party.PartyUpdate, "penalty_value", "objective row")
        wrap(central.CentralUpdate, "step", "central z/y")
        for cls in (losses.LogisticLoss, losses.MultinomialLoss):
            wrap(cls, "mean", "objective row")
        for cls in (accel.Anderson, accel.SpectralRho, accel.Chain):
            wrap(cls, "step", "accelerator")
        wrap(rounds, "sum_releases", "sum")
        wrap(rounds, "alignment", "alignment")
        wrap(rounds, "residuals", "thresholds")

    def _wrap(self, owner, name, key, count=False):
        fn = getattr(owner, name)
        t = self.t

        def timed(*a, **k):
            if count:
                self.k += 1
            t0 = CLOCK()
            try:
                return fn(*a, **k)
            finally:
                if self.k >= 2:
                    t[key] += CLOCK() - t0
        self.saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, timed)

    def close(self):
        for owner, name, fn in reversed(self.saved):
            setattr(owner, name, fn)


def products(blocks, xs, v, reps=20):
    """Median CPU seconds of sum_m (D_m @ x_m, D_m.T @ v)."""
    ts = []
    for _ in range(reps):
        t0 = CLOCK()
        for D, x in zip(blocks, xs):
            D @ x
            D.T @ v
        ts.append(CLOCK() - t0)
    return float(np.median(ts))


def run_set(name, fits, rounds, split, sparse_rows):
    from flower_vfl import VerticalADMM

    c = load(name, sparse_rows)
    R = rounds or c["rounds"]
    kw = dict(c["kw"], max_rounds=R, tol=0)
    VerticalADMM(**kw).fit(c["blocks"], c["y"])          # warm-up
    out = defaultdict(list)
    for i in range(fits):
        sp = Split(parts=split)
        try:
            t0 = time.process_time()
            m = VerticalADMM(**kw).fit(c["blocks"], c["y"])
            cpu = time.process_time() - t0
        finally:
            sp.close()
        el = np.diff([0.0] + [h["elapsed_s"] for h in m.history_])
        out["fit_cpu_s"].append(cpu)
        out["wall_round_s"].append(float(np.median(el[1:])))
        out["round_s"].append(sp.t["round"] / (R - 1))
        for key, val in sp.t.items():
            out["split_" + key].append(val)
        xs = [p.x for p in m._parties]
        v = np.array(m._central.y)
        out["products_s"].append(products(c["blocks"], xs, v))
        print(f"  {name} fit {i + 1}/{fits}: round {1e3 * out['round_s'][-1]:.3f} ms, products "
              f"{1e3 * out['products_s'][-1]:.3f} ms, fit CPU {cpu:.3f} s", flush=True)
    med = {k: float(np.median(v)) for k, v in out.items()}
    res = {"set": name, "rounds": R, "acceleration": m.acceleration_, "n": int(c["y"].size),
           "round_ms": 1e3 * med["round_s"], "products_ms": 1e3 * med["products_s"],
           "ratio": med["round_s"] / med["products_s"], "wall_round_ms": 1e3 * med["wall_round_s"],
           "ratios": [a / b for a, b in zip(out["round_s"], out["products_s"])],
           "fit_cpu_s": med["fit_cpu_s"], "raw": dict(out), "objective": m.history_[-1].get("objective")}
    if split:                            # rounds 2..R
        parts = {k[6:]: med[k] / (R - 1) for k in med if k.startswith("split_")}
        total = parts.pop("round")
        parts["rest of the round"] = total - sum(parts.values())
        res["split_round_ms"] = 1e3 * total
        res["split_share_of_round"] = {k: v / total for k, v in parts.items()}
        res["split_ms_per_round"] = {k: 1e3 * v for k, v in parts.items()}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="a9a,sparse,digits")
    ap.add_argument("--fits", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=0, help="rounds of every fit (default: per set)")
    ap.add_argument("--sparse-rows", type=int, default=1_000_000)
    ap.add_argument("--split", action="store_true", help="time the round's parts too")
    ap.add_argument("--stall", default=None, help="accel.STALL_RATIO: a ratio, or 'off' (default: the module's)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--trees", default=None, help="OLD,NEW: run each tree (PYTHONPATH) in turn, --pairs times")
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args(argv)
    if args.trees:
        return side_by_side(args, argv if argv is not None else sys.argv[1:])
    from threadpoolctl import threadpool_limits

    from flower_vfl.core import accel
    if args.stall is not None:
        accel.STALL_RATIO = None if args.stall == "off" else float(args.stall)
    print(f"accel.STALL_RATIO = {getattr(accel, 'STALL_RATIO', None)}")

    info = C.print_machine()
    load0 = os.getloadavg()
    results = []
    with threadpool_limits(1):
        for name in args.sets.split(","):
            r = run_set(name, args.fits, args.rounds, args.split, args.sparse_rows)
            results.append(r)
            print(f"{name}: {r['rounds']} rounds ({r['acceleration']}), a round {r['round_ms']:.3f} ms, "
                  f"its products {r['products_ms']:.3f} ms: ratio {r['ratio']:.2f} "
                  f"(wall: median round {r['wall_round_ms']:.3f} ms) "
                  f"(fits: {', '.join(f'{x:.2f}' for x in r['ratios'])}); fit CPU {r['fit_cpu_s']:.3f} s; "
                  f"objective {r['objective']!r}")
            for k, v in sorted(r.get("split_ms_per_round", {}).items(), key=lambda kv: -kv[1]):
                print(f"    {k:18s} {v:8.3f} ms  {100 * r['split_share_of_round'][k]:5.1f} %")
    load1 = os.getloadavg()
    print(f"load average before {tuple(round(v, 2) for v in load0)}, after {tuple(round(v, 2) for v in load1)}")
    out = args.out or str(C.RESULTS / "bench_round_split.json")
    C.RESULTS.mkdir(exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"machine": info, "command": "python benchmarks/bench_round_split.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), "loadavg_before": load0, "loadavg_after": load1,
            "results": results}, fh, indent=1)
    print(f"wrote {out}")
    return 0


def side_by_side(args, argv):
    """``--trees OLD,NEW``: this script on each tree in a fresh process, alternated; the summary."""
    import subprocess
    import tempfile
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    if len(trees) != 2:
        raise SystemExit("--trees takes two trees, OLD,NEW")
    drop = {"--trees", "--pairs", "--out"}
    rest, skip = [], False
    for a in argv:                       # the same options, less the side-by-side ones
        if skip:
            skip = False
            continue
        key = a.split("=")[0]
        if key in drop:
            skip = "=" not in a
            continue
        rest.append(a)
    runs = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for t in (trees if i % 2 == 0 else trees[::-1]):
                out = os.path.join(tmp, f"{len(runs[t])}_{trees.index(t)}.json")
                env = dict(os.environ, PYTHONPATH=t)
                subprocess.run([sys.executable, os.path.abspath(__file__), *rest, "--out", out], env=env,
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as fh:
                    runs[t].append(json.load(fh))
    for t in trees:
        print(f"tree {t}:")
        for r in runs[t]:
            for res in r["results"]:
                split = ", ".join(f"{k} {v:.3f}" for k, v in sorted(res.get("split_ms_per_round", {}).items(),
                                                                     key=lambda kv: -kv[1]))
                print(f"  {res['set']}: round {res['round_ms']:.3f} ms, products {res['products_ms']:.3f} ms, "
                      f"ratio {res['ratio']:.2f}, fit CPU {res['fit_cpu_s']:.3f} s (load {r['loadavg_before'][0]:.1f})"
                      + (f"; {split}" if split else ""))
    old, new = runs[trees[0]], runs[trees[1]]
    for j, res in enumerate(old[0]["results"]):
        pairs = [b["results"][j]["round_ms"] / a["results"][j]["round_ms"] for a, b in zip(old, new)]
        print(f"{res['set']}: NEW round / OLD round per pair: {', '.join(f'{x:.3f}' for x in pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
