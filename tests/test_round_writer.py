"""The label owner's per-round files written off the critical path (io/writer.py, issue 24 item 3):
the checkpoint and report the writer thread leaves are, round by round, the ones written in line,
even when each write is slower than a round; a write's error is raised once, at the next round,
and the writes after it in that round are skipped (the report never claims a round whose
checkpoint failed)."""

import json
import threading
import time

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io import checkpoint as ckpt_io
from flower_vfl.io.checkpoint import DiskError, load_checkpoint
from flower_vfl.io.writer import RoundWriter
from flower_vfl.strategies import checkpointing
from flower_vfl.strategies.vertical_admm import VerticalADMMStrategy

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
REAL_OUTPUTS = sa.write_outputs


def run_app(out, monkeypatch, inline, slow=0.0):
    """The ServerApp on breast cancer, 6 rounds; every checkpoint and report as written, per round."""
    monkeypatch.setattr(VerticalADMMStrategy, "write_inline", inline)
    ckpts, reports, threads = {}, {}, set()
    real_save, real_outputs = ckpt_io.save_checkpoint, REAL_OUTPUTS

    def save(folder, arrays, header, key="state-dir"):
        time.sleep(slow)                    # a disk slower than a round: the next round runs meanwhile
        path = real_save(folder, arrays, header, key)
        if header["round"] > 0:             # round 0 (the parties' plans, right after identify) is in line
            threads.add(threading.current_thread().name)
            ckpts[header["round"]] = load_checkpoint(folder)
        return path

    def outputs(strategy, run_config, final=None):
        real_outputs(strategy, run_config, final)
        reports[(final or {}).get("rounds")] = json.loads((out / "report.json").read_text())

    monkeypatch.setattr(checkpointing, "save_checkpoint", save)
    monkeypatch.setattr(sa, "write_outputs", outputs)
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 6, "tol": 0.0, "out-dir": str(out)}
    grid = LocalGrid(HANDLERS, {100 + i: {"partition-id": i} for i in range(2)}, rc)
    sa.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    return ckpts, reports, threads


def test_the_thread_writes_round_by_round_what_in_line_writes(tmp_path, monkeypatch):
    ref, ref_reports, ref_threads = run_app(tmp_path / "inline", monkeypatch, inline=True)
    got, got_reports, threads = run_app(tmp_path / "thread", monkeypatch, inline=False, slow=0.05)
    assert ref_threads == {"MainThread"} and len(threads) == 1 and threads != ref_threads
    assert sorted(got) == sorted(ref) == [1, 2, 3, 4, 5, 6]
    for k in ref:                         # snapshots: round k's state, though round k+1 ran meanwhile
        (a_ref, h_ref), (a_got, h_got) = ref[k], got[k]
        assert sorted(a_got) == sorted(a_ref)
        used = min(h_ref["anderson"]["k"], 5) if h_ref.get("anderson") else 0
        for name in a_ref:         # (Anderson's ring buffers: rows past its k are never written)
            a, b = (a_got[name][:used], a_ref[name][:used]) if name in ("aaS", "aaY") else (a_got[name], a_ref[name])
            assert np.array_equal(a, b), (k, name)
        assert {x: h_got[x] for x in h_got if x != "history"} == {x: h_ref[x] for x in h_ref if x != "history"}
        assert [r["round"] for r in h_got["history"]] == list(range(1, k + 1))     # (its rows carry timings)
        assert [r["train_loss"] for r in h_got["history"]] == [r["train_loss"] for r in h_ref["history"]]
    for k in range(1, 7):                 # the report of round k lists rounds 1..k, as in line
        rows = [r["round"] for r in got_reports[k]["rounds"]]
        assert rows == [r["round"] for r in ref_reports[k]["rounds"]] == list(range(1, k + 1))
        assert got_reports[k]["final"] == {"rounds": k, "running": True}
    for key in ("train_loss", "primal_residual"):
        assert [r[key] for r in got_reports[None]["rounds"]] == [r[key] for r in ref_reports[None]["rounds"]]


def test_a_failed_write_is_raised_once_and_skips_the_rest_of_its_round():
    done, w = [], RoundWriter()

    def fail():
        raise DiskError("state-dir /x/checkpoint.npz: cannot write the checkpoint (No space left on device)")
    w.submit(lambda: done.append("ckpt 1"))
    w.submit(lambda: done.append("report 1"))
    w.wait()
    w.submit(fail)
    w.submit(lambda: done.append("report 2"))       # after the failed checkpoint: skipped
    with pytest.raises(DiskError, match="No space left on device"):
        w.wait()
    w.submit(lambda: done.append("ckpt 3"))         # raised once: the next round writes again
    assert w.close() is None
    assert done == ["ckpt 1", "report 1", "ckpt 3"]


def test_a_failing_run_still_writes_its_rounds_and_returns_the_write_error_for_the_log():
    w = RoundWriter()
    w.submit(lambda: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    err = w.close(raising=False)
    assert isinstance(err, OSError) and err.strerror == "No space left on device"
    assert w._pool is None


def test_a_full_state_dir_stops_the_run_at_the_next_round_with_the_checkpoint_before(tmp_path, monkeypatch):
    """The checkpoint of round 3 fails (disk full) while round 4 runs: the run stops at round 4's
    end naming state-dir; the checkpoint is round 2's, round 3's per-round report is skipped, and
    the failure report lists the rounds done (1-4, as in line it listed 1-3)."""
    out = tmp_path / "out"
    real, writes = ckpt_io.atomic_write, []

    def atomic_write(path, write):
        if path.name == "checkpoint.npz":
            writes.append(path)
            if len(writes) == 4:          # round 0's (right after identify), 1, 2, then round 3's
                raise OSError(28, "No space left on device")
        real(path, write)
    monkeypatch.setattr(ckpt_io, "atomic_write", atomic_write)
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 6, "tol": 0.0, "out-dir": str(out)}
    sent = []
    grid = LocalGrid(HANDLERS, {100 + i: {"partition-id": i} for i in range(2)}, rc,
                     on_reply=lambda msg, reply: sent.append(msg.content["config"]["round"]
                                                              if msg.metadata.message_type == "train" else None))
    with pytest.raises(DiskError) as err:
        sa.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    assert str(err.value).startswith(f"state-dir {out / 'state' / 'checkpoint.npz'}: cannot write the checkpoint "
                                     "(No space left on device); ")
    assert max(r for r in sent if r is not None) == 4               # stopped at the next round, not later
    assert load_checkpoint(out / "state")[1]["round"] == 2
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4] and report["final"]["failed"] is True
    assert report["final"]["error"].startswith("DiskError: state-dir ")
