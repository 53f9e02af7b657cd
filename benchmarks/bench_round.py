"""Per-round compute on a9a: paper-style round vs ours, and ours vs the sparse mat-vecs it cannot avoid.

(a) A paper-style round (benchmarks/paper_style.py: scipy L-BFGS-B x-update, per-sample
    minimize_scalar z-update) against our round with the same semantics (theta = alpha = 1, no
    intercept), both from the same mid-run state. The paper-style round is timed with the
    tolerances that make it agree with ours to < 1e-6 ("tight") and with scipy's defaults.
(b) Our round against MV := for each party m, one D_m @ x_m (N-vector out) and one D_m.T @ v
    (d_m-vector out, v an N-vector): "two sparse mat-vecs with D_m" per party, 2M = 4 products
    in all, each touching every stored nonzero of D_m once. Any x-update that forms D_m^T(target)
    and releases D_m x_m does at least this. Ours is timed in two configurations: paper
    semantics as in (a), and the engine default (theta = 1/M, alpha = 1, intercept solved jointly
    with z by the central node's Newton).

"Our round" = both parties' PartyUpdate.step + commit, the sum, and CentralUpdate.step, i.e.
VerticalADMM.fit's loop body without the objective evaluation and history bookkeeping (the
engine's whole per-round time, objective included, is reported too). The one-off x-factorization
per (D_m, rho) is excluded from the round and reported separately. Timings: time.perf_counter,
state restored outside the timed region before every call, the measurements interleaved
(rotating order) within each repetition, medians reported (minima too, in the JSON). If (b)
exceeds 3x, the default round is profiled with cProfile.

Diagnostic rows (not the goal figures): after the main measurements, both "ours" configurations
and MV are timed again, interleaved, with OpenBLAS limited to one thread for that whole phase
(threadpoolctl; the environment is left alone, and the main phase never sees a thread change).
The BLAS calls that matter in a round are the two np.linalg.norm of N-vectors in
CentralUpdate.step (ndarray.dot -> OpenBLAS ddot on both threads); under some loads of this 2-core
machine each took milliseconds (docs/benchmarks.md), and the kernel table measures such a call
directly. The load average is recorded before and after the run.

    python benchmarks/bench_round.py            # a9a, 5 repetitions (1-3 min, depending on load)
    python benchmarks/bench_round.py --quick    # first 4000 rows, 1 repetition
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import numpy as np

import _common as C
import paper_style as PS

GOAL_PAPER = 100.0
GOAL_MV = 3.0


def _time(fn, before=None):
    if before is not None:
        before()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def setup(blocks, y):
    t = np.where(y > 0, 1.0, -1.0)
    # paper semantics: a mid-run state of the no-intercept problem (as in paper_style.py)
    sp_p, sc_p = PS.round_state(blocks, y)
    sc_p = PS.paper_semantics_state(blocks, sp_p, sc_p)
    ours_p = C.build_ours(blocks, t, sp_p, sc_p, theta=1.0, alpha=1.0, fit_intercept=False)
    paper_tight = PS.make_paper(blocks, t, sp_p, sc_p, options=PS.LBFGSB_TIGHT)
    paper_default = PS.make_paper(blocks, t, sp_p, sc_p, options=PS.LBFGSB_DEFAULT)
    # engine default: sharing (theta = 1/M), joint intercept, after 10 rounds
    sp_d, sc_d = C.mid_run_state(blocks, y, rounds=10)
    ours_d = C.build_ours(blocks, t, sp_d, sc_d, theta=1.0 / len(blocks), alpha=1.0,
                          fit_intercept=True)
    # first step factorizes lam I + rho D_m^T D_m (one-off): time it, then it is cached
    rho_x = sc_d["rho"] / ours_d[1].theta          # the party's x-system uses rho / theta
    fac = [_time(lambda p=p: p.solver._factorize(rho_x)) for p in ours_d[0]]
    C.our_round(*ours_p)
    C.our_round(*ours_d)
    return dict(t=t, sp_p=sp_p, sc_p=sc_p, sp_d=sp_d, sc_d=sc_d, ours_p=ours_p, ours_d=ours_d,
                paper_tight=paper_tight, paper_default=paper_default, factorize_s=fac)


def restore_paper(obj, sp_, sc):
    parties, c = obj
    for p, st in zip(parties, sp_):
        p.x, p.s, p.nit = st["x"].copy(), st["s"].copy(), 0
    c.z, c.y = sc["z"].copy(), sc["y"].copy()
    c.s_sum = sum(st["s"] for st in sp_)


def paper_parts(obj):
    """Time one paper-style round split into its x-updates and its z/y-update."""
    parties, c = obj
    r, y = c.residual(), c.y
    t0 = time.perf_counter()
    s_sum = sum(p.step(r, y, c.rho) for p in parties)
    t1 = time.perf_counter()
    c.step(s_sum)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1


def our_parts(obj):
    parties, c = obj
    t0 = time.perf_counter()
    s_sum = 0.0
    for p in parties:
        s = p.step(c.q, c.y, c.rho, c.alpha, c.theta)
        p.commit(s)
        s_sum = s_sum + s
    t1 = time.perf_counter()
    c.step(s_sum)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1


def make_mv(parties, v):
    Ds = [p.D for p in parties]
    xs = [p.x.copy() for p in parties]

    def mv():
        for D, x in zip(Ds, xs):
            D @ x
            D.T @ v
    return mv


def _blas_one_thread():
    """A context factory limiting OpenBLAS to one thread (None if threadpoolctl is missing)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return None
    ctl = ThreadpoolController()
    return lambda: ctl.limit(limits=1, user_api="blas")


OURS = ("ours_p", "ours_d", "ours_p_blas1", "ours_d_blas1")


def _rotation(T, jobs, mv, inner, suffix=""):
    """``inner`` interleaved timings of each job (order rotated every iteration)."""
    for i in range(inner):
        for j in range(len(jobs)):
            name, before, obj = jobs[(i + j) % len(jobs)]
            if name == "mv":
                T["mv" + suffix].append(_time(mv))
                continue
            before()
            a, b, c = our_parts(obj)
            key = name + suffix
            T[key].append(a), T[key + "_party"].append(b), T[key + "_central"].append(c)


def measure(S, reps, inner):
    """Phase 1, per repetition: one paper-style round of each kind, then the interleaved
    rotation of ours (both configurations) and MV. Phase 2 (diagnostic): the same rotation with
    OpenBLAS limited to one thread for the whole phase (keys ``*_blas1``), so that phase 1 never
    sees the thread count change."""
    from collections import defaultdict

    T = defaultdict(list)
    mv = make_mv(S["ours_d"][0], S["sc_d"]["y"])
    nit = {"tight": [], "default": []}
    jobs = [("ours_p", lambda: C.restore(*S["ours_p"], S["sp_p"], S["sc_p"]), S["ours_p"]),
            ("ours_d", lambda: C.restore(*S["ours_d"], S["sp_d"], S["sc_d"]), S["ours_d"]),
            ("mv", None, None)]
    for rep in range(reps):
        for name, key in (("paper_tight", "tight"), ("paper_default", "default")):
            restore_paper(S[name], S["sp_p"], S["sc_p"])
            a, b, c = paper_parts(S[name])
            T[name].append(a), T[name + "_x"].append(b), T[name + "_z"].append(c)
            nit[key].append([p.nit for p in S[name][0]])
        _rotation(T, jobs, mv, inner)
        print(f"  repetition {rep + 1}/{reps}: paper-style {T['paper_tight'][-1]:.2f} s, ours "
              f"{C.median_ms(T['ours_p'][-inner:]):.2f} / {C.median_ms(T['ours_d'][-inner:]):.2f} ms "
              f"(paper semantics / default), MV {C.median_ms(T['mv'][-inner:]):.3f} ms", flush=True)
    one = _blas_one_thread()
    if one is not None:
        with one():
            _rotation(T, jobs, mv, reps * inner, suffix="_blas1")
        print(f"  OpenBLAS 1 thread: ours {C.median_ms(T['ours_p_blas1']):.2f} / "
              f"{C.median_ms(T['ours_d_blas1']):.2f} ms, MV {C.median_ms(T['mv_blas1']):.3f} ms",
              flush=True)
    return dict(T), nit


def engine_per_round(blocks, y, rounds):
    """Median per-round wall time of VerticalADMM.fit (objective and bookkeeping included)."""
    from flower_vfl import VerticalADMM

    eng = VerticalADMM(lam=C.LAM, max_rounds=rounds, tol=0).fit(blocks, y)
    el = np.diff([0.0] + [h["elapsed_s"] for h in eng.history_])
    return float(np.median(el[1:])), float(el[0])


def profile_default(S, rounds):
    """cProfile of `rounds` default rounds (state restored between rounds, not profiled)."""
    parties, c = S["ours_d"]
    prof = cProfile.Profile()
    for _ in range(rounds):
        C.restore(parties, c, S["sp_d"], S["sc_d"])
        prof.enable()
        C.our_round(parties, c)
        prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(12)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"function": f"{file.split('/work/main/')[-1]}:{line}({fn})", "ncalls": nc,
                     "calls_per_round": nc / rounds, "tottime_ms_per_round": 1e3 * tt / rounds,
                     "cumtime_ms_per_round": 1e3 * ct / rounds})
    rows.sort(key=lambda r: -r["tottime_ms_per_round"])
    return buf.getvalue(), rows


def kernels(n, reps=200):
    """Cost of N-vector kernels (ms): the z-update's pieces, and np.linalg.norm as called in a
    round, i.e. after other work (0.2 ms of N-vector arithmetic between calls), with OpenBLAS at
    its default thread count and at one thread. Median, mean and 90th percentile."""
    import math

    rng = np.random.default_rng(0)
    z = rng.normal(size=n)
    out_buf = np.empty(n)
    one = _blas_one_thread()

    def timed(fn, between=None):
        ts = []
        for _ in range(reps):
            if between is not None:
                between()
            ts.append(_time(fn))
        ts = 1e3 * np.asarray(ts)
        return {"median": float(np.median(ts)), "mean": float(ts.mean()),
                "p90": float(np.percentile(ts, 90))}

    def other_work():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2e-4:
            np.multiply(z, 2.0, out=out_buf)

    out = {
        "np.exp (in place)": timed(lambda: np.exp(z, out=out_buf)),
        "multiply (in place)": timed(lambda: np.multiply(z, z, out=out_buf)),
        "sum": timed(lambda: z.sum()),
        "np.linalg.norm after other work": timed(lambda: np.linalg.norm(z), other_work),
        "sqrt(sum(v*v)) after other work": timed(lambda: math.sqrt(float((z * z).sum())),
                                                 other_work),
    }
    if one is not None:
        with one():
            out["np.linalg.norm after other work, BLAS 1 thread"] = timed(
                lambda: np.linalg.norm(z), other_work)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="first 4000 rows, 1 repetition")
    ap.add_argument("--reps", type=int, default=None, help="paper-style repetitions (default 5)")
    ap.add_argument("--inner", type=int, default=30, help="our-round timings per repetition")
    ap.add_argument("--out", default=None, help="JSON output (default benchmarks/results/...)")
    args = ap.parse_args(argv)
    info = C.print_machine()
    blocks, y, _, _ = C.load_a9a()
    if args.quick:
        blocks, y = [D[:4000] for D in blocks], y[:4000]
    reps = args.reps or (1 if args.quick else 5)
    n = y.size
    print(f"a9a{' (first 4000 rows)' if args.quick else ''}: N={n}, d_m={[D.shape[1] for D in blocks]}, "
          f"nnz_m={[D.nnz for D in blocks]}; {reps} repetitions x {args.inner} inner")

    load0 = os.getloadavg()
    S = setup(blocks, y)
    T, nit = measure(S, reps, args.inner)
    med = {k: C.median_ms(v) for k, v in T.items()}
    best = {k: 1e3 * float(np.min(v)) for k, v in T.items()}

    # correctness of what was timed: one round both ways from the same state
    for obj, name in ((S["paper_tight"], "tight"), (S["paper_default"], "default")):
        restore_paper(obj, S["sp_p"], S["sc_p"])
        PS.paper_round(*obj)
    C.restore(*S["ours_p"], S["sp_p"], S["sc_p"])
    C.our_round(*S["ours_p"])
    d_tight = PS.compare(S["ours_p"], S["paper_tight"])
    d_def = PS.compare(S["ours_p"], S["paper_default"])
    err = lambda d: max(v for k, v in d.items() if k not in ("y", "y_rel"))   # noqa: E731

    eng_med, eng_first = engine_per_round(blocks, y, 30)

    ratio_a = med["paper_tight"] / med["ours_p"]
    ratio_a_def = med["paper_default"] / med["ours_p"]
    ratio_b = {k: med[k] / med["mv_blas1" if k.endswith("_blas1") else "mv"]
               for k in OURS if k in med}
    ratio_b_p, ratio_b_d = ratio_b["ours_p"], ratio_b["ours_d"]
    print("\n(a) paper-style round vs ours, same semantics (theta=alpha=1, no intercept), same state")
    print(f"  paper-style, tight L-BFGS-B  {med['paper_tight']:10.1f} ms  (x-updates "
          f"{med['paper_tight_x']:.1f} ms, {np.median([sum(v) for v in nit['tight']]):.0f} L-BFGS-B "
          f"iterations; z-loop {med['paper_tight_z']:.1f} ms)  max diff vs ours {err(d_tight):.1e}")
    print(f"  paper-style, scipy defaults  {med['paper_default']:10.1f} ms  (x-updates "
          f"{med['paper_default_x']:.1f} ms, {np.median([sum(v) for v in nit['default']]):.0f} "
          f"iterations; z-loop {med['paper_default_z']:.1f} ms)  max diff vs ours {err(d_def):.1e}")
    print(f"  ours                         {med['ours_p']:10.3f} ms  (parties {med['ours_p_party']:.3f} "
          f"ms, central {med['ours_p_central']:.3f} ms)")
    print(f"  ratio paper-style / ours: {ratio_a:.0f}x (tight), {ratio_a_def:.0f}x (scipy defaults); "
          f"goal >= {GOAL_PAPER:.0f}x: {'met' if min(ratio_a, ratio_a_def) >= GOAL_PAPER else 'MISSED'}")
    print("\n(b) our round vs MV = sum over parties of (D_m @ x_m + D_m.T @ v)  [4 sparse mat-vecs]")
    print(f"  MV                           {med['mv']:10.3f} ms  (min {best['mv']:.3f}; "
          f"{med.get('mv_blas1', float('nan')):.3f} in the 1-thread phase)")
    labels = {"ours_p": "ours, paper semantics", "ours_d": "ours, engine default",
              "ours_p_blas1": "  same, OpenBLAS 1 thread", "ours_d_blas1": "  same, OpenBLAS 1 thread"}
    for k in ("ours_p", "ours_p_blas1", "ours_d", "ours_d_blas1"):
        if k in med:
            print(f"  {labels[k]:28s} {med[k]:10.3f} ms  -> {ratio_b[k]:.1f}x MV  (parties "
                  f"{med[k + '_party']:.3f} ms, central {med[k + '_central']:.3f} ms; min {best[k]:.3f})")
    print(f"  goal <= {GOAL_MV:.0f}x: paper semantics {'met' if ratio_b_p <= GOAL_MV else 'MISSED'}, "
          f"default {'met' if ratio_b_d <= GOAL_MV else 'MISSED'}  (the 1-thread rows are a diagnostic)")
    print(f"  one-off factorization per party: {[round(1e3 * f, 3) for f in S['factorize_s']]} ms")
    print(f"  VerticalADMM.fit per round (default, objective included): median {1e3 * eng_med:.2f} ms "
          f"over rounds 2-30 (round 1: {1e3 * eng_first:.1f} ms incl. factorization)")
    load1 = os.getloadavg()
    print(f"  load average (1, 5, 15 min) before {tuple(round(v, 2) for v in load0)}, after "
          f"{tuple(round(v, 2) for v in load1)} on {os.cpu_count()} cores")

    result = {"machine": info, "quick": args.quick, "n": int(n), "reps": reps, "inner": args.inner,
              "command": "python benchmarks/bench_round.py " + " ".join(argv if argv is not None
                                                                       else sys.argv[1:]),
              "loadavg_before": load0, "loadavg_after": load1,
              "median_ms": med, "min_ms": best, "ratio_paper_over_ours_tight": ratio_a,
              "ratio_paper_over_ours_default_tol": ratio_a_def, "ratio_ours_paper_sem_over_mv": ratio_b_p,
              "ratio_ours_default_over_mv": ratio_b_d, "ratios_over_mv": ratio_b,
              "maxdiff_tight": err(d_tight),
              "maxdiff_default_tol": err(d_def), "lbfgsb_iterations": nit,
              "factorize_ms": [1e3 * f for f in S["factorize_s"]],
              "engine_round_ms_median": 1e3 * eng_med, "engine_round1_ms": 1e3 * eng_first}

    if max(ratio_b_p, ratio_b_d) > GOAL_MV:
        print("\nprofile (cProfile, 50 default rounds; state restored outside the profile):")
        text, rows = profile_default(S, 50)
        print(f"  {'function':58s} {'calls/round':>11s} {'tottime ms/round':>17s} {'cumtime ms/round':>17s}")
        for r in rows[:10]:
            print(f"  {r['function'][-58:]:58s} {r['calls_per_round']:11.1f} "
                  f"{r['tottime_ms_per_round']:17.3f} {r['cumtime_ms_per_round']:17.3f}")
        result["profile_top"] = rows[:15]
    k = kernels(n)
    print(f"\nN-vector kernels (N={n}, ms: median / mean / p90):")
    for a, b in k.items():
        print(f"  {a:50s} {b['median']:.4f} / {b['mean']:.4f} / {b['p90']:.4f}")
    result["kernels_ms"] = k

    out = args.out or str(C.RESULTS / f"bench_round{'_quick' if args.quick else ''}.json")
    C.RESULTS.mkdir(exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
