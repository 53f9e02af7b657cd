"""The vertical ServerApp's own disk (issue 23): an ``out-dir`` or label-owner ``state-dir`` that
is a plain file, under a plain file, or read-only stops the run before any message with an error
naming the key, the path and the fix; a disk that fills during the run names the path and the key
and keeps the previous report and checkpoint whole."""

import json
import os
import subprocess

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.errors import UserError
from flower_vfl.io.checkpoint import DiskError, load_checkpoint

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
FIX = ("set the run-config key {key} to a writable folder with free space on the label owner's disk (not a "
       "file; it is created if missing), or free/remount this one")


class NoRounds(LocalGrid):
    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("a message was sent before the run's folders were checked")


def main_no_rounds(rc):
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(DiskError) as err:
        sa.main(NoRounds({}, {}, rc), ctx)
    assert isinstance(err.value, UserError) and isinstance(err.value, OSError)
    return str(err.value)


@pytest.mark.parametrize("key", ["out-dir", "state-dir"])
def test_a_plain_file_folder_stops_before_any_message(tmp_path, key):
    plain = tmp_path / "plain"
    plain.write_text("not a folder")
    rc = {"dataset": "breast_cancer", key: str(plain)}
    assert main_no_rounds(rc) == f"{key} {plain} is a file, not a folder; {FIX.format(key=key)}"
    assert plain.read_text() == "not a folder"


@pytest.mark.parametrize("key", ["out-dir", "state-dir"])
def test_a_folder_under_a_plain_file_stops_before_any_message(tmp_path, key):
    plain = tmp_path / "plain"
    plain.write_text("not a folder")
    rc = {"dataset": "breast_cancer", key: str(plain / "run")}
    assert main_no_rounds(rc) == (f"{key} {plain / 'run'} is a file, not a folder (its parent {plain} is a file); "
                                  f"{FIX.format(key=key)}")


def test_the_default_state_dir_under_out_dir_is_checked(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "state").write_text("not a folder")           # <out-dir>/state: the checkpoint folder
    rc = {"dataset": "breast_cancer", "out-dir": str(out)}
    assert main_no_rounds(rc) == f"state-dir {out / 'state'} is a file, not a folder; {FIX.format(key='state-dir')}"


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MB tmpfs of our own: chmod does not stop root, a read-only mount does."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a read-only or full folder needs a small tmpfs of our own (mounting needs root with "
                    "CAP_SYS_ADMIN; chmod does not stop root); this machine cannot")
    yield mnt
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True)
    subprocess.run(["umount", "--lazy", str(mnt)], check=True)


@pytest.mark.parametrize("key", ["out-dir", "state-dir"])
def test_a_read_only_folder_stops_before_any_message(small_fs, key):
    folder = small_fs / "run"
    folder.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    rc = {"dataset": "breast_cancer", key: str(folder)}
    assert main_no_rounds(rc) == f"{key} {folder} cannot be written (Read-only file system); {FIX.format(key=key)}"
    assert os.listdir(folder) == []


def fill(mnt):
    with open(mnt / "filler", "wb", buffering=0) as fh:   # the filesystem to its last block
        try:
            while True:
                fh.write(b"\1" * 4096)
        except OSError:
            pass


def run_filling(monkeypatch, rc, mnt, when):
    """The ServerApp in process; the disk fills ``when`` = ("before"|"after", k): before round k's
    report is written (its checkpoint already is) or after it (before round k+1's checkpoint)."""
    real = sa.write_outputs

    def write_outputs(strategy, run_config, final=None):
        at = (final or {}).get("rounds") if (final or {}).get("running") else None
        if when == ("before", at):
            fill(mnt)
        real(strategy, run_config, final)
        if when == ("after", at):
            fill(mnt)

    monkeypatch.setattr(sa, "write_outputs", write_outputs)
    sent = []
    grid = LocalGrid(HANDLERS, {100 + i: {"partition-id": i} for i in range(2)}, rc,
                     on_reply=lambda msg, reply: sent.append(msg.metadata.message_type))
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(DiskError) as err:
        sa.main(grid, ctx)
    assert "train" in sent
    return str(err.value)


def test_a_full_out_dir_names_it_and_keeps_the_previous_report(small_fs, tmp_path, monkeypatch):
    out, state = small_fs / "out", tmp_path / "state"       # the checkpoint on another disk
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 6, "out-dir": str(out),
          "state-dir": str(state)}
    msg = run_filling(monkeypatch, rc, small_fs, ("before", 3))
    assert msg == (f"out-dir {out / 'report.json'}: cannot write the report (No space left on device); "
                   f"{FIX.format(key='out-dir')}; the previous report, if any, is intact")
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2] and report["final"] == {"rounds": 2, "running": True}
    assert (out / "metrics.csv").read_text().count("\n") == 3                  # header + 2 rounds
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv", "report.json"]   # no temp file left
    _, header = load_checkpoint(state)                                          # written before the report
    assert header["round"] == 3


def test_a_full_state_dir_names_it_and_keeps_the_previous_checkpoint(small_fs, monkeypatch):
    out = small_fs / "out"                                 # state-dir: <out-dir>/state, same disk
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 6, "out-dir": str(out)}
    msg = run_filling(monkeypatch, rc, small_fs, ("after", 2))
    state = out / "state"
    assert msg == (f"state-dir {state / 'checkpoint.npz'}: cannot write the checkpoint (No space left on device); "
                   f"{FIX.format(key='state-dir')}; the previous checkpoint, if any, is intact")
    arrays, header = load_checkpoint(state)
    assert header["round"] == 2 and np.isfinite(arrays["z"]).all()
    assert sorted(p.name for p in state.iterdir()) == ["checkpoint.npz"]       # no temp file left
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2]
