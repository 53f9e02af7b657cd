"""CPU time to a relative objective gap, the engine against every applicable scikit-learn solver,
with an ORACLE STOP on both sides. One command prints every ratio (benchmarks/results/bench_vs_sklearn.json).

Cases (engine = VerticalADMM with its defaults, tol=0; logistic with an intercept unless said):
  a9a-l2    a9a (paper split, lam 1e-4), L2                              tuned on
  a9a-l1    a9a L1 (lam 1e-4)                                            tuned on
  sparse    1M x (100, 200, 300) binary at 5 % (_synth.sparse_binary)    tuned on (theta rule)
  digits    scikit-learn's digits / 16, multinomial K = 10, 2 x 32 columns, lam 1e-4
  fmnist    Fashion-MNIST multinomial, K = 10, 60000 x (2 x 392), pixels in [0, 1], lam 1e-4
            (--fmnist-rows 10000: its first 10,000 rows)
  skewed    100k x (40, 60) log-normal skewed, correlated columns (_synth.dense_skewed)     NOT tuned on
  mixture   20k x (30, 30), 5 classes, Student-t noise, multinomial (_synth.multiclass_mixture)  NOT tuned on
  counts    150k x (500, 1500) sparse log-counts, Zipf columns (_synth.sparse_counts)     NOT tuned on
Each case runs at the gaps --gaps (default 1e-4 and 1e-6).

Peers: every scikit-learn solver that solves the same problem (an unpenalized intercept):
lbfgs, newton-cg, newton-cholesky, sag, saga for L2 (binary and multinomial), saga for L1.
liblinear is left out: it penalizes the intercept (a different problem). newton-cholesky is
skipped where one Hessian costs more than 2e11 flops (N (d K)^2; Fashion-MNIST: 2.3e12).

Threads: by default everything runs under threadpoolctl with ONE BLAS/OpenMP thread (both
sides); --threads 0 leaves the libraries' defaults.

Oracle stop: f* = the smallest objective seen (a long engine run, and a tight run of
newton-cholesky (binary L2), saga (L1) or lbfgs (multinomial) at tol 1e-12); the engine's stop is
the first round k whose gap (f - f*)/|f*| <= the target (from its history; the timed run is
max_rounds=k, the same deterministic trajectory); a peer's is the smallest max_iter j (tol=0,
random_state 0) whose model reaches the same gap, found by doubling then bisection (for
sag/saga j-1 is checked too); a peer whose single fit exceeds --peer-cap-s CPU s in the search, or
that needs more than 20000 iterations, is reported as not reached. Times are
time.process_time() of this process, data loading and the searches excluded. Each of --pairs
timed pairs runs the engine and every peer, in alternating order (engine first in even pairs,
last in odd ones); the ratio engine / peer is reported as min and median over the pairs, and the
1-minute load average (/proc/loadavg) is recorded with every pair.

    python benchmarks/bench_vs_sklearn.py [--cases a9a-l2,digits,...] [--gaps 1e-4,1e-6] [--pairs 3]
        [--threads 1] [--peer-cap-s 120] [--solvers lbfgs,...] [--ref-iters N] [--reference earlier.json] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

import _common as C
import _synth
from flower_vfl import VerticalADMM

L2_SOLVERS = ("lbfgs", "newton-cg", "newton-cholesky", "sag", "saga")
NC_MAX_FLOPS = 2e11
CASES = ("a9a-l2", "a9a-l1", "sparse", "digits", "fmnist", "skewed", "mixture", "counts")
UNTUNED = ("skewed", "mixture", "counts")


def objective(X, y, coef, intercept, lam, penalty, multinomial):
    """(1/N) sum loss + lam R(coef), computed the same way for both sides."""
    f = X @ coef + intercept
    if multinomial:
        loss = np.mean(logsumexp(f, axis=1) - f[np.arange(y.size), y])
    else:
        loss = np.mean(np.logaddexp(0.0, -y * f))
    reg = lam * np.abs(coef).sum() if penalty == "l1" else lam / 2 * float(np.sum(coef * coef))
    return float(loss + reg)


def load(name, quick, fmnist_rows=0):
    """dict: blocks, y, lam, penalty, multinomial, engine round cap (``fmnist_rows``: the first that
    many Fashion-MNIST training rows; 0: all 60000, or 10000 with ``quick``)."""
    c = dict(lam=1e-4, penalty="l2", multinomial=False, cap=300)
    if name in ("a9a-l2", "a9a-l1"):
        tr, y = C.load_a9a()[:2]
        c.update(blocks=tr, y=y, penalty=name[-2:], cap=400)
    elif name == "sparse":
        B, y = _synth.sparse_binary(n_rows=200_000 if quick else 1_000_000)
        c.update(blocks=B, y=y, cap=60)
    elif name == "digits":
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        c.update(blocks=[np.ascontiguousarray(X[:, :32]), np.ascontiguousarray(X[:, 32:])], y=y,
                 multinomial=True, cap=400)
    elif name == "fmnist":
        from flower_vfl.datasets import load_fashion_mnist
        X, y = load_fashion_mnist()[:2]        # pixels already scaled to [0, 1]
        rows = fmnist_rows or (10_000 if quick else 0)
        if rows:
            X, y = X[:rows], y[:rows]
        c.update(blocks=[np.ascontiguousarray(X[:, :392]), np.ascontiguousarray(X[:, 392:])],
                 y=np.asarray(y), multinomial=True, cap=500)     # 1e-6: ~260-300 rounds
    elif name == "skewed":
        B, y = _synth.dense_skewed(n_rows=20_000 if quick else 100_000)
        c.update(blocks=B, y=y)
    elif name == "mixture":
        B, y = _synth.multiclass_mixture()
        c.update(blocks=B, y=y, multinomial=True)
    elif name == "counts":
        B, y = _synth.sparse_counts(n_rows=30_000 if quick else 150_000)
        c.update(blocks=B, y=y)
    else:
        raise ValueError(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    X = sp.hstack(c["blocks"]).tocsr() if sp.issparse(c["blocks"][0]) else np.hstack(c["blocks"])
    c["X"] = X
    K = int(np.unique(c["y"]).size) if c["multinomial"] else 1
    d = X.shape[1]
    if c["penalty"] == "l1":
        c["solvers"], c["skipped"] = ["saga"], {"liblinear": "penalizes the intercept"}
        c["ref_solver"] = "saga"
    else:
        c["solvers"], c["skipped"] = list(L2_SOLVERS), {"liblinear": "penalizes the intercept"}
        flops = float(X.shape[0]) * float(d * K) ** 2
        if flops > NC_MAX_FLOPS:
            c["solvers"].remove("newton-cholesky")
            c["skipped"]["newton-cholesky"] = f"one Hessian costs N (dK)^2 = {flops:.1e} flops"
        c["ref_solver"] = "lbfgs" if c["multinomial"] or "newton-cholesky" not in c["solvers"] else "newton-cholesky"
    return c


def engine(c, rounds, **kw):
    kw = dict(loss="multinomial" if c["multinomial"] else "logistic", lam=c["lam"],
              penalty=c["penalty"], max_rounds=rounds, tol=0, **kw)
    t0 = time.process_time()
    m = VerticalADMM(**kw).fit(c["blocks"], c["y"])
    return m, time.process_time() - t0


def peer(c, solver, max_iter, tol=0.0):
    """(objective, CPU s) of scikit-learn's ``solver`` after ``max_iter`` iterations."""
    n = c["y"].size
    kw = dict(C=1.0 / (n * c["lam"]), solver=solver, max_iter=int(max_iter), tol=tol, random_state=0)
    if c["penalty"] == "l1":
        kw.update(l1_ratio=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        t0 = time.process_time()
        m = LogisticRegression(**kw).fit(c["X"], c["y"])
        secs = time.process_time() - t0
    coef = m.coef_.T if c["multinomial"] else m.coef_.ravel()
    icpt = m.intercept_ if c["multinomial"] else float(m.intercept_[0])
    return objective(c["X"], c["y"], coef, icpt, c["lam"], c["penalty"], c["multinomial"]), secs


def search_iters(gap_of, hi_cap, check_prev):
    """Smallest j <= hi_cap with gap_of(j) <= 0 (doubling then bisection); None if none (or
    gap_of returns None: over the CPU cap)."""
    lo, hi = 0, 1
    while True:
        g = gap_of(hi)
        if g is None:
            return None
        if g <= 0:
            break
        lo, hi = hi, hi * 2
        if lo >= hi_cap:
            return None
        hi = min(hi, hi_cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        g = gap_of(mid)
        lo, hi = (lo, mid) if g is not None and g <= 0 else (mid, hi)
    if check_prev:        # sag/saga: the objective need not be monotone in the epochs
        while hi > 1 and (gap_of(hi - 1) or 1.0) <= 0:
            hi -= 1
    return hi


def load1() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def run_case(name, gaps, quick, pairs, peer_cap, reference=None, only=None, ref_iters=None, fmnist_rows=0):
    """One case's rows (one per gap): the engine and every peer (``only``: those), alternated."""
    c = load(name, quick, fmnist_rows)
    if reference and reference.get("n_rows") not in (None, int(c["y"].size)):
        print(f"{name}: --reference holds {reference['n_rows']} rows, this run {c['y'].size}: not used", flush=True)
        reference = None
    if only is not None:
        for s in [s for s in c["solvers"] if s not in only]:
            c["solvers"].remove(s)
            c["skipped"][s] = "not run here (--solvers)"
        if c["ref_solver"] not in c["solvers"] and c["solvers"]:
            c["ref_solver"] = c["solvers"][0]
    m, t_long = engine(c, c["cap"])
    obj = np.array([h["objective"] for h in m.history_])
    ref = (reference or {}).get("f_ref")
    if ref is not None:
        f_ref, t_ref = float(ref), None
    else:
        f_ref, t_ref = peer(c, c["ref_solver"], ref_iters or (20000 if c["ref_solver"] == "lbfgs" else 1000), tol=1e-12)
    f_star = min(f_ref, float(obj.min()))
    gap = (obj - f_star) / abs(f_star)
    out = []
    for target in gaps:
        hit = np.flatnonzero(gap <= target)
        k = int(hit[0]) + 1 if hit.size else None
        iters, notes = {}, dict(c["skipped"])
        for s in c["solvers"]:
            known = (reference or {}).get("peer_iters", {}).get(f"{target:g}", {}).get(s)
            cache = {}

            def peer_gap(j, s=s, cache=cache):
                if j not in cache:
                    f, secs = peer(c, s, j)
                    cache[j] = None if secs > peer_cap else (f - f_star) / abs(f_star) - target
                return cache[j]

            if known is not None and peer_gap(int(known)) is not None and peer_gap(int(known)) <= 0:
                iters[s] = int(known)
            else:
                iters[s] = search_iters(peer_gap, 20000, check_prev=s in ("sag", "saga"))
            if iters[s] is None:
                notes[s] = f"gap {target:g} not reached within 20000 iterations or {peer_cap:g} CPU s a fit"
        run = [s for s in c["solvers"] if iters[s] is not None]
        row = {"case": name, "untuned": name in UNTUNED, "target_gap": target, "n_rows": int(c["y"].size),
               "n_cols": int(c["X"].shape[1]), "f_star": f_star,
               "f_star_from": "engine" if obj.min() <= f_ref else c["ref_solver"],
               "engine_rounds": k, "engine_acceleration": m.acceleration_, "peer_iters": iters,
               "not_run": notes, "engine_long_s": t_long, "peer_tight_s": t_ref}
        print(name, target, {"engine_rounds": k, "peer_iters": iters}, flush=True)
        if k is None:
            out.append(row)
            continue
        te, tp, loads = [], {s: [] for s in run}, []
        for i in range(pairs):
            loads.append(load1())
            order = ["engine"] + run if i % 2 == 0 else run[::-1] + ["engine"]
            for who in order:
                if who == "engine":
                    te.append(engine(c, k)[1])
                else:
                    tp[who].append(peer(c, who, iters[who])[1])
        row.update(engine_cpu_s=te, peer_cpu_s=tp, load_1min=loads,
                   engine_gap=float(gap[k - 1]),
                   ratio={s: {"min": float(np.min(np.array(te) / tp[s])),
                              "median": float(np.median(np.array(te) / tp[s]))} for s in run})
        if run:
            best = min(run, key=lambda s: np.median(tp[s]))
            row["best_peer"] = best
            row["ratio_vs_best"] = row["ratio"][best]
        out.append(row)
        print(f"{name} {target:g}: engine {k} rounds {np.median(te):.3g} s; "
              + "; ".join(f"{s} {iters[s]} it {np.median(tp[s]):.3g} s ratio {row['ratio'][s]['min']:.2f}/"
                          f"{row['ratio'][s]['median']:.2f}" for s in run) + f" (load {loads})", flush=True)
    return out


def table(rows):
    lines = ["| case | gap | engine rounds | engine CPU s | peer: iterations, CPU s, ratio min / median | "
             "vs the fastest peer | load (1 min) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        tag = r["case"] + (f", {r['n_rows']:,} rows" if r["case"] == "fmnist" and r["n_rows"] < 60000 else "")
        tag += " (untuned)" if r["untuned"] else ""
        if r.get("engine_cpu_s") is None:
            lines.append(f"| {tag} | {r['target_gap']:g} | not reached in {r['engine_rounds']} | - | - | - | - |")
            continue
        peers = "; ".join(f"{s} {r['peer_iters'][s]}, {np.median(r['peer_cpu_s'][s]):.3g}, "
                          f"{r['ratio'][s]['min']:.2f} / {r['ratio'][s]['median']:.2f}" for s in r["ratio"])
        peers += "".join(f"; {s}: {why}" for s, why in r["not_run"].items())
        best = (f"{r['best_peer']}: **{r['ratio_vs_best']['min']:.2f} / {r['ratio_vs_best']['median']:.2f}**"
                if r.get("best_peer") else "-")
        lines.append(f"| {tag} | {r['target_gap']:g} | {r['engine_rounds']} | {np.median(r['engine_cpu_s']):.3g} "
                     f"| {peers} | {best} | {min(r['load_1min']):.1f}-{max(r['load_1min']):.1f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--gaps", default="1e-4,1e-6")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads on both sides (0: the libraries' default)")
    ap.add_argument("--peer-cap-s", type=float, default=120.0)
    ap.add_argument("--ref-iters", type=int, default=None,
                    help="cap the tight reference run's iterations (f* is still the better of it and the engine's "
                         "long run; the row records which)")
    ap.add_argument("--solvers", default=None,
                    help="only these peers (comma-separated), e.g. lbfgs,newton-cg for Fashion-MNIST, where a "
                         "sag/saga search takes hours; the others are listed as not run")
    ap.add_argument("--quick", action="store_true", help="smaller sets, for development only (no file written)")
    ap.add_argument("--fmnist-rows", type=int, default=0,
                    help="fmnist: the first that many training rows (e.g. 10000; 0: all 60000); the row records it")
    ap.add_argument("--out", default=str(C.RESULTS / "bench_vs_sklearn.json"))
    ap.add_argument("--reference", default=None,
                    help="an earlier result file of this script: per case, its f* reference objective and its "
                         "peers' iterations are tried first (each is checked against this run's f*; a peer that "
                         "does not reach the gap there is searched again)")
    args = ap.parse_args(argv)
    if args.pairs < 2:
        raise SystemExit("--pairs must be >= 2 (min/median over pairs)")
    refs = {}
    if args.reference:
        with open(args.reference) as fh:
            for r in json.load(fh)["rows"]:
                e = refs.setdefault(r["case"], {"f_ref": r["f_star"], "peer_iters": {}, "n_rows": r.get("n_rows")})
                e["f_ref"] = min(e["f_ref"], r["f_star"])
                iters = r["peer_iters"]
                if not isinstance(iters, dict):     # a file of the earlier one-peer layout
                    iters = {r["peer"]: iters}
                e["peer_iters"].setdefault(f"{r['target_gap']:g}", {}).update(iters)
    gaps = [float(g) for g in args.gaps.split(",")]
    out = {"machine": C.print_machine(), "threads": args.threads,
           "command": "python benchmarks/bench_vs_sklearn.py " + " ".join(argv or []), "load_before": load1()}
    from threadpoolctl import threadpool_limits
    limit = threadpool_limits(limits=args.threads) if args.threads > 0 else contextlib.nullcontext()
    rows = []
    with limit:
        for n in args.cases.split(","):
            rows += run_case(n, gaps, args.quick, args.pairs, args.peer_cap_s, refs.get(n),
                             None if args.solvers is None else args.solvers.split(","), args.ref_iters,
                             args.fmnist_rows)
            out["rows"] = rows
            if not args.quick:      # after every case: a long run keeps what it measured
                with open(args.out, "w") as fh:
                    json.dump(dict(out, load_after=load1()), fh, indent=1, default=str)
    print()
    print(table(rows))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
