"""The secure sum's cost on a9a (N = 32561): bytes and seconds of a round, against the plain round.

For M = 2..16 parties (a9a's 123 columns split into M contiguous blocks; logistic, L2, lam = 1e-4,
theta = 1/M, intercept), from a mid-run state (5 plain rounds):

- plain round: every party's x-update (PartyUpdate.step + commit) and the central node's step
  on the plain sum of the releases (what the in-process engine does);
- secure round: the same, plus each party's broadcast digest (SHA-256 of q, y and the scalars),
  fixed-point encoding and masking (M - 1 AES-256-CTR streams of 8N bytes), and the central
  node's modular sum and decoding (flower_vfl.secagg). The decoded sum is checked against the
  plain sum (max error <= M / (2 scale)).
- one-off per run: each party's key agreement (X25519 key, Ed25519 signature, M - 1 signature
  checks, X25519 exchanges and HKDFs).

Seconds are CPU seconds of this process (time.process_time: on this shared 2-core machine the wall
clock mostly measures waiting; wall medians are in the CSV too), medians of --reps repetitions.
"serial" ratio: one process does every party's work (the in-process engine); "parallel" ratio:
parties compute at once (a deployment), so a round costs the slowest party plus the central node.
Bytes: the messages' vectors serialized as Flower Arrays (flwr.app.Array, .npy bytes), per round
(downlink q, y to each party, uplink one N-vector from each party) and one-off (an advert up per
party, the M adverts down to each party). Writes benchmarks/results/bench_secagg.{csv,json,png}.

    python benchmarks/bench_secagg.py                # M = 2..16, 5 repetitions (about 1-2 min)
    python benchmarks/bench_secagg.py --parties 2,4 --reps 2
    python benchmarks/bench_secagg.py --flower       # the Flower path, M = 2, 4, 8, 16 (LocalGrid, the
        # in-process Flower grid: real ClientApp handlers, run config secagg=true vs false, 3
        # interleaved repetitions): bytes, wall and CPU seconds of a round, and the one-off key
        # agreement -> benchmarks/results/bench_secagg_flower.{csv,json}
"""

from __future__ import annotations

import argparse
import csv
import json
import time

import numpy as np

import _common as C
from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.losses import get_loss
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.secagg import KeyAgreement, MaskContext, Roster, Session, broadcast_digest, secure_sum
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

#: a9a's folder (the repository's ../shared/data/a9a), for the Flower path's run and node configs
A9A_DIR = str((C.ROOT if hasattr(C, "ROOT") else __import__("pathlib").Path(__file__).resolve().parents[1])
              .resolve().parent / "shared" / "data" / "a9a")

#: the parties' declared bound on their releases (a9a's scores stay well inside)
BOUND = 64.0


def array_bytes(a) -> int:
    from flwr.app import Array
    return len(Array(np.asarray(a)).data)


def split_blocks(X, m):
    cols = np.array_split(np.arange(X.shape[1]), m)
    return [X[:, c].tocsr() for c in cols]


class Clock:
    def __enter__(self):
        self.c0, self.w0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self.c0, time.perf_counter() - self.w0
        return False


def setup(m, run="bench"):
    """Key agreement of m parties; per-party CPU seconds (generate + sign, then verify + derive)."""
    ids = [Ed25519PrivateKey.generate() for _ in range(m)]
    names = [f"p{i:02d}" for i in range(m)]
    pins = {n: k.public_key() for n, k in zip(names, ids)}
    t_adv, ags = [], []
    for n, k in zip(names, ids):
        with Clock() as c:
            ags.append(KeyAgreement(n, run, BOUND, signing_key=k))
        t_adv.append(c.cpu)
    adverts = [a.advert for a in ags]
    t_est, sessions = [], []
    for a in ags:
        with Clock() as c:
            sessions.append(Session.establish(a, adverts, {n: p for n, p in pins.items() if n != a.name}))
        t_est.append(c.cpu)
    adv_bytes = [len(a.to_bytes()) for a in adverts]
    return sessions, Roster(adverts), np.add(t_adv, t_est), adv_bytes


def measure(X, t, m, reps):
    blocks = split_blocks(X, m)
    theta, rho = 1.0 / m, 1.0
    parties = [PartyUpdate(D, get_penalty("l2"), C.LAM) for D in blocks]
    central = CentralUpdate(get_loss("logistic"), t, rho, theta=theta)

    def party_steps():
        out, times = [], []
        for p in parties:
            with Clock() as c:
                s = p.step(central.q, central.y, central.rho, central.alpha, central.theta)
                p.commit(s)
            out.append(s)
            times.append(c)
        return out, times

    for _ in range(5):                                     # warm-up: factorizations, a mid-run state
        ss, _ = party_steps()
        central.step(np.sum(ss, axis=0))
    sessions, roster, t_setup, adv_bytes = setup(m)
    rows = []
    for r in range(reps):
        states = [{k: np.array(v, copy=True) for k, v in p.get_state().items()} for p in parties]
        cstate = {k: np.array(v, copy=True) for k, v in central.get_state().items()}
        pred = {k: np.array(v, copy=True) for k, v in central.predictor_state().items()}
        q, y = central.q.copy(), central.y.copy()
        cfg = {"round": 6 + r, "rho": central.rho, "alpha": central.alpha, "theta": central.theta}
        # plain round
        ss, pt = party_steps()
        with Clock() as cc:
            s_sum = np.sum(ss, axis=0)
            central.step(s_sum)
        plain = {"party_cpu": [c.cpu for c in pt], "central_cpu": cc.cpu,
                 "party_wall": [c.wall for c in pt], "central_wall": cc.wall}
        # the secure extra on the same releases: digest + encode + mask per party, unmask + decode
        dig, msk, masked = [], [], {}
        for sess, s in zip(sessions, ss):
            with Clock() as c1:
                ctx = MaskContext(6 + r, "train", broadcast_digest({"q": q, "y": y}, cfg))
            with Clock() as c2:
                masked[sess.name] = sess.release(s, ctx)
            dig.append(c1)
            msk.append(c2)
        with Clock() as cu:
            got = secure_sum(masked, roster)
        err = float(np.max(np.abs(got - s_sum)))
        assert err <= roster.fixed_point.error_bound + 8 * np.spacing(np.max(np.abs(s_sum))), err
        rows.append({**plain, "digest_cpu": [c.cpu for c in dig], "mask_cpu": [c.cpu for c in msk],
                     "mask_wall": [c1.wall + c2.wall for c1, c2 in zip(dig, msk)],
                     "unmask_cpu": cu.cpu, "unmask_wall": cu.wall, "max_err": err,
                     "max_abs_s": float(max(np.max(np.abs(s)) for s in ss))})
        # restore the state so every repetition measures the same round
        for p, st in zip(parties, states):
            p.set_state(st)
        central.z, central.y, central.q = cstate["z"], cstate["y"], cstate["q"]
        central.b = np.float64(cstate["b"].ravel()[0])
        central.set_predictor_state(pred)

    med = lambda key, f=sum: float(np.median([f(r[key]) if isinstance(r[key], list) else r[key]  # noqa: E731
                                              for r in rows]))
    plain_serial = med("party_cpu") + med("central_cpu")
    plain_par = med("party_cpu", max) + med("central_cpu")
    extra_serial = med("digest_cpu") + med("mask_cpu") + med("unmask_cpu")
    extra_par = float(np.median([max(d + k for d, k in zip(r["digest_cpu"], r["mask_cpu"])) for r in rows])) + \
        med("unmask_cpu")
    n = X.shape[0]
    down = array_bytes(central.q) + array_bytes(central.y)
    up_plain = array_bytes(np.zeros(n))
    up_sec = array_bytes(np.zeros(n, dtype=np.uint64))
    return {
        "parties": m, "N": n, "bound": BOUND, "scale_log2": roster.fixed_point.k,
        "error_bound": roster.fixed_point.error_bound, "max_err": max(r["max_err"] for r in rows),
        "max_abs_release": max(r["max_abs_s"] for r in rows),
        "plain_round_cpu_s": plain_serial, "plain_round_parallel_cpu_s": plain_par,
        "digest_cpu_s_per_party": med("digest_cpu", np.median), "mask_cpu_s_per_party": med("mask_cpu", np.median),
        "mask_cpu_s_all_parties": med("mask_cpu") + med("digest_cpu"), "unmask_cpu_s": med("unmask_cpu"),
        "mask_wall_s_all_parties": med("mask_wall"), "unmask_wall_s": med("unmask_wall"),
        "plain_round_wall_s": med("party_wall") + med("central_wall"),
        "ratio_s_serial": (plain_serial + extra_serial) / plain_serial,
        "ratio_s_parallel": (plain_par + extra_par) / plain_par,
        "round_bytes_plain": m * (down + up_plain), "round_bytes_secagg": m * (down + up_sec),
        "ratio_bytes": (down + up_sec) / (down + up_plain),
        "setup_cpu_s_per_party": float(np.median(t_setup)),
        "setup_bytes": int(sum(adv_bytes) + m * sum(adv_bytes)),
    }


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    M = [r["parties"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    ax[0].plot(M, [r["plain_round_cpu_s"] * 1e3 for r in rows], "o-", label="plain round (all parties + central)")
    ax[0].plot(M, [r["mask_cpu_s_all_parties"] * 1e3 for r in rows], "s-", label="secure extra: digest + mask, all parties")
    ax[0].plot(M, [(r["digest_cpu_s_per_party"] + r["mask_cpu_s_per_party"]) * 1e3 for r in rows], "^-",
               label="secure extra: one party")
    ax[0].plot(M, [r["unmask_cpu_s"] * 1e3 for r in rows], "v-", label="secure extra: central unmask + decode")
    ax[0].set_xlabel("parties M")
    ax[0].set_ylabel("CPU ms per round")
    ax[0].set_yscale("log")
    ax[0].set_title(f"a9a, N = {rows[0]['N']}: seconds per round")
    ax[0].legend(fontsize=8)
    ax[1].plot(M, [r["ratio_s_serial"] for r in rows], "o-", label="seconds, serial (one process)")
    ax[1].plot(M, [r["ratio_s_parallel"] for r in rows], "s-", label="seconds, parallel parties")
    ax[1].plot(M, [r["ratio_bytes"] for r in rows], "^-", label="bytes per round")
    ax[1].axhline(1.0, color="grey", lw=0.8)
    ax[1].set_xlabel("parties M")
    ax[1].set_ylabel("secure round / plain round")
    ax[1].set_title("cost ratio of the secure sum")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def message_bytes(msg) -> int:
    """The vectors and config values a message carries (Flower Arrays' .npy bytes; strings and
    bytes by length, numbers 8 bytes): what the wire carries besides Flower's framing."""
    if not msg.has_content():
        return 0
    n = 0
    for rec in msg.content.array_records.values():
        n += sum(len(rec[k].data) for k in rec)
    for rec in msg.content.config_records.values():
        for v in rec.values():
            vs = v if isinstance(v, list) else [v]
            n += sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in vs)
    return n


def flower_run(m, secagg, rounds):
    import warnings
    warnings.filterwarnings("ignore")
    from flower_vfl.apps import client as ca
    from flower_vfl.apps.server import make_strategy
    from flower_vfl.deploy.local_grid import LocalGrid
    handlers = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify,
                "query.secagg_keys": ca.secagg_keys}
    rc = {"dataset": "a9a", "num-parties": m, "max-rounds": rounds, "secagg": secagg, "lam": 1e-4,
          "acceleration": "none", "party-wait": 5.0, "data-dir": A9A_DIR,
          "variant": "sharing-fixed"}     # theta 1/M on both sides: a secure run cannot follow the releases
    traffic, cpu_at = {}, {}

    def count(msg, rep):
        kind = msg.metadata.message_type
        if kind == "train":
            kind = f"train{msg.content['config']['round']}"
            cpu_at[msg.content['config']['round']] = time.process_time()   # after the round's last reply
        down, up = traffic.get(kind, (0, 0))
        traffic[kind] = (down + message_bytes(msg), up + message_bytes(rep))
    grid = LocalGrid(handlers, {100 + i: {"partition-id": i, "data-dir": A9A_DIR} for i in range(m)}, rc,
                     on_reply=count)
    st = make_strategy(rc)
    c0, w0 = time.process_time(), time.perf_counter()
    st.start(grid=grid, num_rounds=rounds, timeout=600)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    el = [r["elapsed_s"] for r in st.history_]
    per_round = float(np.median(np.diff(el)))
    # CPU of a round: from the last reply of round k - 1 to the last reply of round k (the central
    # step of round k - 1, then every party's handler of round k), median over k = 2..rounds
    cpu_round = float(np.median(np.diff([cpu_at[k] for k in sorted(cpu_at)])))
    last = traffic[f"train{rounds}"]
    keys = traffic.get("query.secagg_keys", (0, 0))
    return st, {"wall_s_round": per_round, "cpu_s_round": cpu_round, "cpu_s_run": cpu, "wall_s_run": wall,
                "bytes_down_round": last[0], "bytes_up_round": last[1],
                "keys_bytes_down": keys[0], "keys_bytes_up": keys[1]}


def _median_runs(runs):
    """One dict from ``reps`` runs: the median of the per-round seconds, the rest of the first."""
    out = dict(runs[0])
    for k in ("wall_s_round", "cpu_s_round", "cpu_s_run", "wall_s_run"):
        out[k] = float(np.median([r[k] for r in runs]))
    return out


def flower_main(ms, rounds, out, reps=1):
    from flower_vfl.secagg import FixedPoint
    from flower_vfl.clients.party_secagg import DEFAULT_BOUND
    rows = []
    load0 = open("/proc/loadavg").read().split()[:3]
    for m in ms:
        plains, secs = [], []
        for _ in range(reps):               # interleaved: plain, secure, plain, secure, ...
            plain_st, p = flower_run(m, False, rounds)
            sa_st, q = flower_run(m, True, rounds)
            plains.append(p)
            secs.append(q)
        plain, sa = _median_runs(plains), _median_runs(secs)
        err = float(np.max(np.abs(sa_st.decision_test_ - plain_st.decision_test_)))
        row = {"parties": m, "rounds": rounds, "reps": reps, "N": int(plain_st.central.n),
               "error_bound_round": FixedPoint([DEFAULT_BOUND] * m).error_bound,
               **{f"plain_{k}": v for k, v in plain.items() if not k.startswith("keys")},
               **{f"secagg_{k}": v for k, v in sa.items()},
               "ratio_wall_round": sa["wall_s_round"] / plain["wall_s_round"],
               "ratio_cpu_round": sa["cpu_s_round"] / plain["cpu_s_round"],
               "ratio_bytes_round": (sa["bytes_down_round"] + sa["bytes_up_round"])
               / (plain["bytes_down_round"] + plain["bytes_up_round"]),
               "max_decision_diff": err}
        rows.append(row)
        print(f"M={m}: round plain {plain['wall_s_round'] * 1e3:.1f} ms, secagg {sa['wall_s_round'] * 1e3:.1f} ms "
              f"(x{row['ratio_wall_round']:.2f}; CPU {plain['cpu_s_round'] * 1e3:.1f} -> {sa['cpu_s_round'] * 1e3:.1f} "
              f"ms, x{row['ratio_cpu_round']:.2f}); bytes/round plain "
              f"{plain['bytes_down_round'] + plain['bytes_up_round']}"
              f" secagg {sa['bytes_down_round'] + sa['bytes_up_round']} (x{row['ratio_bytes_round']:.4f}); keys once "
              f"{sa['keys_bytes_down'] + sa['keys_bytes_up']} B; max |decision diff| {err:.2e}", flush=True)
    with open(out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out + ".json", "w") as fh:
        json.dump({"machine": C.machine_info(), "deployment": "LocalGrid (in-process Flower grid, real ClientApp "
                   "handlers, one process)", "loadavg_before": load0,
                   "loadavg_after": open("/proc/loadavg").read().split()[:3], "rows": rows}, fh, indent=1)
    print("wrote", out + ".{csv,json}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parties", default=None, help="default: 2..16 (2,4,8,16 with --flower)")
    ap.add_argument("--reps", type=int, default=None, help="default: 5 (3 with --flower, interleaved runs)")
    ap.add_argument("--flower", action="store_true", help="through the Flower path (LocalGrid)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.flower:
        return flower_main([int(v) for v in (args.parties or "2,4,8,16").split(",")], args.rounds,
                           args.out or str(C.RESULTS / "bench_secagg_flower"), args.reps or 3)
    args.parties = args.parties or ",".join(str(m) for m in range(2, 17))
    args.reps = args.reps or 5
    args.out = args.out or str(C.RESULTS / "bench_secagg")
    info = C.print_machine()
    (X1, X2), ytr, _, _ = C.load_a9a()
    import scipy.sparse as sp
    X = sp.hstack([X1, X2]).tocsr()
    t = np.asarray(ytr, dtype=float)
    load0 = open("/proc/loadavg").read().split()[:3]
    rows = []
    for m in [int(v) for v in args.parties.split(",")]:
        row = measure(X, t, m, args.reps)
        rows.append(row)
        print(f"M={m:2d}  plain {row['plain_round_cpu_s'] * 1e3:7.1f} ms  mask(all) "
              f"{row['mask_cpu_s_all_parties'] * 1e3:6.1f} ms  unmask {row['unmask_cpu_s'] * 1e3:5.1f} ms  "
              f"ratio s serial {row['ratio_s_serial']:.3f} parallel {row['ratio_s_parallel']:.3f}  "
              f"bytes {row['ratio_bytes']:.4f}  setup/party {row['setup_cpu_s_per_party'] * 1e3:.2f} ms "
              f"{row['setup_bytes']} B  err {row['max_err']:.2e} <= {row['error_bound']:.2e}", flush=True)
    with open(args.out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(args.out + ".json", "w") as fh:
        json.dump({"machine": info, "loadavg_before": load0, "loadavg_after": open("/proc/loadavg").read().split()[:3],
                   "reps": args.reps, "rows": rows}, fh, indent=1)
    plot(rows, args.out + ".png")
    print("wrote", args.out + ".{csv,json,png}")


if __name__ == "__main__":
    main()
