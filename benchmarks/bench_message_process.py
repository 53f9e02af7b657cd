"""What one message costs a party on a real SuperNode before any ADMM work.

On real nodes (flwr 1.41) every message runs in a fresh ``flwr-clientapp`` process, so each
train message pays: interpreter start, imports, loading the party's columns, building its
x-update solver (the factorization of lam I + rho D^T D), then one x-update. Each stage is timed
as a fresh subprocess that stops after it, ``--reps`` times interleaved; the table gives medians
and each stage's increment.

    python benchmarks/bench_message_process.py [--reps 3] [--dataset a9a]

``--fork``: what a real node's warm executor pays instead (flower_vfl.deploy.warm_exec): a process
that imported what the executor imports before its forks (its WARM_IMPORTS, the app, its warm
caches, the BLAS thread timeout it sets) forks one child per message, and each child runs the real
``train`` handler once on a9a (party 0 and party 1, round 3 of a 4-round run captured first on the
in-process LocalGrid, with that party's context.state and block cache as the node had them), then
once more in the same process (a warm process, for comparison). As the executor does when it reaps a
child, the forking process maps the verified blocks the child reports (``warm_exec``'s report and
``party_cache.preload_blocks``; a tree without them: nothing), so from its second child of a party on
the block is mapped before the fork. With ``--app-dir`` repeated, each
tree (its own ``flower_vfl``) runs in its own such process, alternated ``--reps`` times:

    python benchmarks/bench_message_process.py --fork --reps 5 --forks 6 \
        --app-dir /tmp/before --app-dir /tmp/after

``--pull``: what a forked ClientApp's pull of its task input costs (Flower's ``PullTaskInput``,
which carries the run's FAB, content included, with every message) against a real SuperNode
Runtime API, with and without flower-vfl-supernode's ``fab-skip``:

    python benchmarks/bench_message_process.py --pull --reps 4 --calls 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STAGES = {
    "python": "pass",
    "import flwr (clientapp, app)": "import flwr.clientapp, flwr.app",
    "import flower_vfl.apps.client": "import flower_vfl.apps.client",
    "+ load the party's block": "import flower_vfl.apps.client\nfrom flower_vfl.io.data import party_block\n"
                                "party_block('{ds}', 1, 2)",
    "+ solver + one x-update": "import flower_vfl.apps.client, numpy as np\nfrom flower_vfl.io.data import party_block\n"
                               "from flower_vfl.core.party import PartyUpdate\n"
                               "from flower_vfl.core.penalties import get_penalty\n"
                               "D, _ = party_block('{ds}', 1, 2)\nn = D.shape[0]\n"
                               "PartyUpdate(D, get_penalty('l2'), 1e-4).step(np.ones(n), np.zeros(n), 1e-5, 1.0, 0.5)",
}


#: the in-process run whose round-3 train messages the forked children answer
FORK_ROUNDS = 4


def _capture(tree_state: Path, data_dir: str) -> None:
    """(In a process of the tree being measured.) A FORK_ROUNDS-round a9a run on the LocalGrid with
    the real handlers; every train message and its node's Context (as it was before the handler)
    pickled to ``tree_state/msgs.pkl``; the parties' state folders (block cache) under ``tree_state``."""
    import copy
    import pickle

    from flwr.app import ArrayRecord, Context

    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": FORK_ROUNDS, "tol": 0.0, "data-dir": data_dir}
    snaps = []

    def train(msg, ctx):
        snaps.append((msg, Context(run_id=ctx.run_id, node_id=ctx.node_id, node_config=dict(ctx.node_config),
                                   state=copy.deepcopy(ctx.state), run_config=dict(ctx.run_config))))
        return ca.train(msg, ctx)
    nodes = {100 + m: {"partition-id": m, "data-dir": data_dir, "state-dir": str(tree_state / f"party{m}")}
             for m in range(2)}
    grid = LocalGrid({"query.identify": ca.identify, "train": train, "evaluate": ca.evaluate}, nodes, rc)
    sa.make_strategy(rc).start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=FORK_ROUNDS, timeout=600)
    (tree_state / "msgs.pkl").write_bytes(pickle.dumps(snaps))


def _fork_child_main(tree_state: Path, data_dir: str, forks: int) -> None:
    """(In a process of the tree being measured, started with its ``flower_vfl`` first on the path.)
    Import what the warm executor imports, then fork ``forks`` children per party; print one JSON
    line: per party, the handler's seconds in each child (first call, then a second call)."""
    import importlib
    import importlib.util
    import os
    import pickle

    from flower_vfl.deploy import warm_exec as we
    if hasattr(we, "blas_timeout_env"):          # before numpy, as the executor's main does
        we.blas_timeout_env()
    for mod in we.WARM_IMPORTS:
        importlib.import_module(mod)
    if not (tree_state / "msgs.pkl").exists():
        pid = os.fork()                          # captured in a child: this process stays as the executor's
        if pid == 0:
            try:
                _capture(tree_state, data_dir)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    pre = we.AppPreloader()
    we.preload_installed(pre, "flower_vfl.apps.client")
    for mod in ("flower_vfl.clients.party_secagg", "flower_vfl.privacy.distributed"):   # what a child reports
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    from flwr.supercore.task_identity import TaskIdentity
    snaps = pickle.loads((tree_state / "msgs.pkl").read_bytes())
    train = {int(ctx.node_config["partition-id"]): (msg, ctx)                # round 3 (snaps: train only)
             for msg, ctx in snaps[2 * (FORK_ROUNDS - 2):2 * (FORK_ROUNDS - 1)]}
    out = {m: {"first": [], "second": []} for m in train}
    for _ in range(forks):
        for m, (msg, ctx) in train.items():
            r, w = os.pipe()
            blob = pickle.dumps(ctx)
            pid = os.fork()
            if pid == 0:
                os.close(r)
                import gc
                gc.freeze()
                from flower_vfl.apps import client as ca
                TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, ctx.node_id
                t = time.perf_counter()
                ca.train(msg, ctx)
                first = time.perf_counter() - t
                t = time.perf_counter()
                ca.train(msg, pickle.loads(blob))       # the same message again, in this now warm process
                second = time.perf_counter() - t
                # what the child reports to the executor (warm_exec: the verified blocks it was served)
                served = getattr(sys.modules.get(we.BLOCK_CACHE if hasattr(we, "BLOCK_CACHE") else ""),
                                 "served_blocks", lambda: [])()
                os.write(w, json.dumps([first, second, served]).encode())
                os._exit(0)
            os.close(w)
            got = b""
            while chunk := os.read(r, 4096):
                got += chunk
            os.close(r)
            os.waitpid(pid, 0)
            first, second, *served = json.loads(got)
            if served and served[0] and getattr(we, "warm_blocks_enabled", lambda: False)():
                we.sys.modules[we.BLOCK_CACHE].preload_blocks(served[0])   # as the executor does when it reaps it
            out[m]["first"].append(first)
            out[m]["second"].append(second)
    print(json.dumps(out))


def fork_main(args) -> None:
    import os
    import tempfile
    trees = [str(Path(t).resolve()) for t in (args.app_dir or [str(Path(__file__).resolve().parents[1])])]
    work = Path(tempfile.mkdtemp(prefix="bench_message_fork_"))
    res = {t: {0: {"first": [], "second": []}, 1: {"first": [], "second": []}} for t in trees}
    loads = []
    for rep in range(args.reps):
        for k in (range(len(trees)) if rep % 2 == 0 else reversed(range(len(trees)))):
            tree = trees[k]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
            env.pop("OPENBLAS_THREAD_TIMEOUT", None) if args.clear_blas_env else None
            code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
                    f"import bench_message_process as b; from pathlib import Path; "
                    f"b._fork_child_main(Path({str(work / f'tree{k}')!r}), {args.data_dir!r}, {args.forks})")
            (work / f"tree{k}").mkdir(exist_ok=True)
            out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True,
                                 text=True, check=True, cwd=str(work))
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for m in (0, 1):
                for key in ("first", "second"):
                    res[tree][m][key] += got[str(m)][key]
            loads.append(os.getloadavg()[0])
    print(f"a9a train handler, round 3, in processes forked as the warm executor forks them; "
          f"{args.reps} alternated repetitions x {args.forks} forks a party; load {[round(x, 1) for x in loads]}")
    rows = {}
    for tree in trees:
        rows[tree] = {}
        for m in (0, 1):
            f, s2 = res[tree][m]["first"], res[tree][m]["second"]
            rows[tree][m] = {"first_median_s": statistics.median(f), "second_median_s": statistics.median(s2),
                             "first_all_s": f, "second_all_s": s2}
            print(f"{tree} party {m}: forked child's handler {statistics.median(f) * 1e3:6.1f} ms median "
                  f"(min {min(f) * 1e3:.1f}); the same message again in that process {statistics.median(s2) * 1e3:6.1f} ms")
    out = Path(args.out or Path(__file__).parent / "results" / "bench_message_fork.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "loadavg_1min": loads,
                               "rows": rows}, indent=1))
    print(f"wrote {out}")
    import shutil
    shutil.rmtree(work, ignore_errors=True)


def _pull_server(port: int, fab_path: str, ctx_bytes: int, skip: bool, conn) -> None:
    """(A process.) Flower's SuperNode Runtime API (its FastAPI app under uvicorn on loopback, as
    ``flower-supernode`` serves it) over a stub NodeState holding one run: the FAB read from
    ``fab_path``, a context of ``ctx_bytes`` (the party's a9a context.state is ~37 KB), one task.
    ``skip``: with flower-vfl-supernode's fab-skip. Sends the FAB's hash, then, when asked, the
    server handler's seconds per call."""
    import hashlib
    import threading
    import warnings
    warnings.simplefilter("ignore")
    import numpy as np
    import uvicorn
    from flwr.app import ArrayRecord, Context, RecordDict
    from flwr.proto.task_pb2 import Task
    from flwr.supercore.fab import Fab
    from flwr.supercore.run import Run
    from flwr.supernode.main import create_app

    import flwr.supernode.servicer.runtime.runtime_handlers as rh
    if skip:
        from flower_vfl.deploy.installed_fab import serve_installed_fabs
        assert serve_installed_fabs({})
    content = Path(fab_path).read_bytes()
    fab = Fab(hashlib.sha256(content).hexdigest(), content, {})
    run = Run.create_empty(7)
    run.fab_id, run.fab_version, run.fab_hash = "flower-vfl/flower-vfl", "0", fab.hash_str
    ctx = Context(run_id=7, node_id=3, node_config={"partition-id": 0},
                  state=RecordDict({"vfl.factor": ArrayRecord([np.zeros(ctx_bytes // 8)])}), run_config={})

    class State:
        def get_task_by_token(self, token):
            return Task(task_id=5, run_id=7)

        def get_run(self, run_id):
            return run

        def get_run_series_context(self, series_id):
            return ctx

        def get_fab(self, fab_hash):
            return fab

        def activate_task(self, task_id=None):
            return True

    class Factory:
        def state(self):
            return State()
    handler, times = rh.pull_task_input, []

    def timed(*a):
        t = time.perf_counter()
        out = handler(*a)
        times.append(time.perf_counter() - t)
        return out
    rh.pull_task_input = timed              # a benchmark's timer around whichever handler is there
    srv = uvicorn.Server(uvicorn.Config(app=create_app(state_factory=Factory()), host="127.0.0.1", port=port,
                                        log_level="error"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.02)
    conn.send(fab.hash_str)
    conn.recv()
    conn.send(times)


def _pull_client(port: int, hashes, n: int, conn) -> None:
    """(A process.) Flower's Runtime API client as a ClientApp makes it; ``n`` PullTaskInput calls
    (naming ``hashes`` as installed, as a forked ClientApp with fab-announce does), each followed
    by what the ClientApp does with the answer before the app runs (parse the context, run and
    FAB; the SHA-256 of a FAB's content that fab-reuse keys on)."""
    import hashlib
    import warnings
    warnings.simplefilter("ignore")
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.runtime_pb2 import PullTaskInputRequest
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    from flower_vfl.deploy.installed_fab import announcement
    client = RuntimeHttpClient.from_server_address(
        f"127.0.0.1:{port}", True, None,
        [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor("token")])
    req = PullTaskInputRequest()
    if hashes:
        req.MergeFromString(announcement(hashes))
    call, after = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        res = client.PullTaskInput(req)
        t1 = time.perf_counter()
        context_from_proto(res.context)
        run_from_proto(res.run)
        fab = fab_from_proto(res.fab)
        if fab.content:
            hashlib.sha256(fab.content).hexdigest()
        after.append(time.perf_counter() - t1)
        call.append(t1 - t0)
    conn.send({"call": call, "after": after, "bytes": {"answer": res.ByteSize(), "fab": res.fab.ByteSize(),
                                                       "context": res.context.ByteSize(), "run": res.run.ByteSize()}})


def pull_main(args) -> None:
    """``--pull``: a ClientApp's PullTaskInput against a real SuperNode Runtime API, the FAB sent in
    full (Flower) and without content (fab-skip), alternated; bytes of the answer by part, the
    server handler's time, the call's time, and the ClientApp's work on the answer."""
    import multiprocessing as mp
    import socket
    import tempfile
    fab_path = args.fab
    if fab_path is None:                      # the FAB `flwr run` builds from this checkout
        from flwr.cli.build import build_fab_from_disk
        fab_path = str(Path(tempfile.mkdtemp(prefix="bench_pull_")) / "app.fab")
        Path(fab_path).write_bytes(build_fab_from_disk(Path(__file__).resolve().parents[1]))
    res = {m: {"call": [], "after": [], "handler": []} for m in ("full", "skip")}
    loads = []
    for rep in range(args.reps):
        for mode in (("full", "skip") if rep % 2 == 0 else ("skip", "full")):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            sa, sb = mp.Pipe()
            server = mp.Process(target=_pull_server, args=(port, fab_path, args.context_bytes, mode == "skip", sb))
            server.start()
            fab_hash = sa.recv()
            ca, cb = mp.Pipe()
            client = mp.Process(target=_pull_client, args=(port, [fab_hash] if mode == "skip" else [], args.calls, cb))
            client.start()
            got = ca.recv()
            client.join()
            sa.send("times")
            handler = sa.recv()
            server.terminate()
            server.join()
            for key, vals in (("call", got["call"]), ("after", got["after"]), ("handler", handler)):
                res[mode][key] += vals[2:]            # the first calls warm the connection
            res[mode]["bytes"] = got["bytes"]
            loads.append(os.getloadavg()[0])
    print(f"PullTaskInput on a real SuperNode Runtime API (loopback HTTP), {args.reps} alternated repetitions x "
          f"{args.calls} calls; load {[round(x, 1) for x in loads]}")
    for mode, r in res.items():
        print(f"{mode:4s}: answer {r['bytes']['answer']:,} B (FAB {r['bytes']['fab']:,}, context "
              f"{r['bytes']['context']:,}, run {r['bytes']['run']:,}); medians: call "
              f"{statistics.median(r['call']) * 1e3:.2f} ms, of it the node's handler "
              f"{statistics.median(r['handler']) * 1e3:.2f} ms; the ClientApp's parse (+ SHA-256 of the FAB) "
              f"{statistics.median(r['after']) * 1e3:.2f} ms")
    out = Path(args.out or Path(__file__).parent / "results" / "bench_message_pull.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "loadavg_1min": loads,
                               "rows": {m: {**{f"{k}_median_s": statistics.median(r[k]) for k in
                                               ("call", "after", "handler")}, "bytes": r["bytes"]}
                                        for m, r in res.items()}}, indent=1))
    print(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dataset", default="a9a")
    ap.add_argument("--fork", action="store_true", help="the train handler in processes forked as the warm "
                    "executor forks them (a9a), instead of the stages of a fresh interpreter")
    ap.add_argument("--forks", type=int, default=6, help="--fork: children per party per repetition")
    ap.add_argument("--app-dir", action="append", default=None, help="--fork: a flower-vfl tree (repeatable)")
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a"))
    ap.add_argument("--clear-blas-env", action="store_true",
                    help="--fork: drop $OPENBLAS_THREAD_TIMEOUT from the environment of each tree's process")
    ap.add_argument("--pull", action="store_true",
                    help="a ClientApp's PullTaskInput on a real SuperNode Runtime API: the FAB in full (Flower) "
                         "and without content (flower-vfl-supernode's fab-skip), alternated")
    ap.add_argument("--fab", default=None, help="--pull: a FAB file (default: built from this checkout)")
    ap.add_argument("--calls", type=int, default=30, help="--pull: calls per repetition and mode")
    ap.add_argument("--context-bytes", type=int, default=37_300,
                    help="--pull: the context's array bytes (a9a's party context.state: ~37 KB)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.fork:
        return fork_main(args)
    if args.pull:
        return pull_main(args)
    times = {k: [] for k in STAGES}
    for _ in range(args.reps):
        for name, code in STAGES.items():
            t = time.perf_counter()
            subprocess.run([sys.executable, "-W", "ignore", "-c", code.format(ds=args.dataset)], check=True,
                           capture_output=True)
            times[name].append(time.perf_counter() - t)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{args.dataset}, {args.reps} interleaved repetitions, load average {' '.join(load)}")
    prev = 0.0
    rows = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"median_s": med, "increment_s": med - prev, "all_s": ts}
        print(f"{name:34s} {med:7.2f} s  (+{med - prev:5.2f} s)")
        prev = med
    out = Path(__file__).parent / "results" / "bench_message_process.json"
    out.write_text(json.dumps({"dataset": args.dataset, "loadavg": load, "stages": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
