"""ServerApp: time ``grid.send_and_receive`` of one message to every SuperNode, many times.

Modes (run config ``modes``, interleaved so that a slow stretch of a noisy machine hits
all of them alike):
  tiny           a scalar each way;
  payload        what flower-vfl's central node sends each ADMM round (two float64
                 N-vectors q and y per party) and one N-vector back per party, as
                 Flower's ArrayRecords;
  packed         the same bytes as ``bytes`` values of one ConfigRecord each way (2
                 Flower objects a message instead of 7 and 5: flower_vfl.io.wire);
  packed-v       packed with one N-vector down (the x-update target v that flower-vfl's
                 central node sends a party at alpha = 1) and one back;
  payload-state  payload, and the party keeps two N-vectors in ``context.state``;
  payload-busy   payload-state, and the party spins ``busy-s`` seconds (a stand-in for
                 the x-update compute) before replying.
Each reply carries the party's wall-clock handler entry/exit, so the round trip splits into
delivery (push -> first handler entry), handling (first entry -> last exit) and return
(last exit -> send_and_receive returns).
"""

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def _content(mode, n, k, busy):
    cfg = ConfigRecord({"mode": "payload-state" if mode == "payload-busy" else mode, "round": k,
                        "busy_s": busy if mode == "payload-busy" else 0.0})
    if mode == "tiny":
        return RecordDict({"config": cfg})
    rng = np.random.default_rng(k)
    if mode == "packed":
        return RecordDict({"config": ConfigRecord({**dict(cfg), "q": rng.standard_normal(n).tobytes(),
                                                   "y": rng.standard_normal(n).tobytes()})})
    if mode == "packed-v":
        return RecordDict({"config": ConfigRecord({**dict(cfg), "q": rng.standard_normal(n).tobytes()})})
    return RecordDict({"config": cfg, "vectors": ArrayRecord({"q": Array(rng.standard_normal(n)),
                                                               "y": Array(rng.standard_normal(n))})})


def _send_and_receive(grid, msgs, pull):
    """Flower's ``grid.send_and_receive`` (``pull`` = (0, 0)), or push and pull from ``pull[0]`` s,
    growing x1.5 up to ``pull[1]`` s (the schedule flower-vfl's central node uses)."""
    if not pull[1]:
        return list(grid.send_and_receive(msgs, timeout=600))
    ids, out, wait = set(grid.push_messages(msgs)), [], pull[0]
    end = time.monotonic() + 600
    while ids and time.monotonic() < end:
        got = list(grid.pull_messages(ids))
        out += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if ids:
            time.sleep(wait)
            wait = min(wait * 1.5, pull[1])
    return out


def _round_trip(grid, nodes, mode, n, k, busy, pull=(0.0, 0.0)):
    msgs = [Message(_content(mode, n, k, busy), dst_node_id=nid, message_type="train") for nid in nodes]
    t_push = time.time()
    replies = _send_and_receive(grid, msgs, pull)
    t_back = time.time()
    if len(replies) != len(nodes) or any(r.has_error() for r in replies):
        raise RuntimeError(f"{mode}: {len(replies)}/{len(nodes)} replies, "
                           f"errors: {[r.error.reason for r in replies if r.has_error()]}")
    if mode in ("packed", "packed-v"):
        assert all(len(r.content["config"]["s"]) == 8 * n for r in replies)
    elif mode != "tiny":
        assert all(r.content["release"]["s"].numpy().shape == (n,) for r in replies)
    t_in = min(float(r.content["config"]["t_in"]) for r in replies)
    t_out = max(float(r.content["config"]["t_out"]) for r in replies)
    return {"total": t_back - t_push, "delivery": t_in - t_push, "handling": t_out - t_in,
            "return": t_back - t_out}


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    repeats, warmup, n = int(rc["repeats"]), int(rc["warmup"]), int(rc["n"])
    busy = float(rc["busy-s"])
    pull = (float(rc.get("pull-first", 0.0)), float(rc.get("pull-max", 0.0)))
    modes = [m.strip() for m in str(rc["modes"]).split(",") if m.strip()]
    deadline = time.time() + 120          # the SuperNodes may register after the ServerApp starts
    while len(nodes := sorted(grid.get_node_ids())) < int(rc["num-nodes"]):
        if time.time() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {rc['num-nodes']} SuperNodes registered")
        time.sleep(0.1)
    for k in range(warmup):
        for mode in modes:
            _round_trip(grid, nodes, mode, n, 10**6 + k, busy, pull)
    times = {m: [] for m in modes}
    out_dir = str(rc.get("out-dir", "") or "")
    t0, rounds = time.monotonic(), []
    for k in range(repeats):
        for mode in modes:
            times[mode].append(_round_trip(grid, nodes, mode, n, k, busy, pull))
        if out_dir:       # as flower-vfl's report.json: one entry per round (all modes once), elapsed_s
            rounds.append({"round": k + 1, "elapsed_s": time.monotonic() - t0, "t": time.time()})
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            tmp = Path(out_dir) / "report.json.tmp"
            tmp.write_text(json.dumps({"rounds": rounds, "nodes": len(nodes), "modes": modes}))
            tmp.replace(Path(out_dir) / "report.json")
    summary = {m: {part: {"mean": float(np.mean([t[part] for t in v])),
                          "median": float(np.median([t[part] for t in v]))}
                   for part in ("total", "delivery", "handling", "return")}
               for m, v in times.items()}
    out = {"nodes": len(nodes), "n": n, "pull": list(pull), "repeats": repeats, "warmup": warmup, "busy_s": busy,
           "bytes_to_each_node": {"tiny": 0, "payload": 16 * n, "payload-state": 16 * n, "payload-busy": 16 * n,
                                  "packed": 16 * n, "packed-v": 8 * n},
           "bytes_from_each_node": {"tiny": 0, "payload": 8 * n, "payload-state": 8 * n, "payload-busy": 8 * n,
                                    "packed": 8 * n, "packed-v": 8 * n},
           "summary_s": summary, "round_trips_s": times}
    idle = float(rc.get("idle-s", 0.0))
    if idle > 0:          # the nodes idle (polling) while this process waits: bench_floor.py's idle rate
        time.sleep(idle)
    print(json.dumps({m: s["total"] for m, s in summary.items()}))
    path = str(rc["out-file"])
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1))
