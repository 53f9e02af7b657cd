"""A damaged ``checkpoint.npz`` is refused with one clear error, before any party is contacted.

Each case of the issue's table (truncated, a flipped byte, empty, pickled, an array missing, a
NaN in z) used to end in a raw ``BadZipFile`` / ``Bad CRC-32`` / ``EOFError`` / ``ValueError`` /
``KeyError: 'y'``, or (the NaN) in a round that blamed party 0's q. Now the resume stops at
:func:`flower_vfl.io.checkpoint.load_checkpoint` with :class:`CheckpointDamaged` naming the file,
what is wrong and the fix. In process: the real strategy and the real ClientApp handlers over a
LocalGrid (tests/test_strategy_faults.py), one real 8-round run's checkpoint damaged per case.
"""

import io
import pickle
import shutil
import zipfile

import numpy as np
import pytest

from flower_vfl.io.checkpoint import CHECKPOINT, CheckpointDamaged, load_checkpoint, save_checkpoint
from tests.test_resume import counting, strategy
from tests.test_strategy_faults import RC, FaultyGrid, nodes

FIX = ("; it cannot continue the run. The checkpoint is replaced atomically after every round, so this is damage "
       "after it was written (a disk error, a copy cut short, an edit): put back a copy of the whole state folder "
       "if you kept one and resume from it, or start a new run without resume")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A finished 8-round run's state folder (never modified: each case damages a copy)."""
    state = tmp_path_factory.mktemp("ckpt") / "state"
    strategy(**{"state-dir": str(state)}).start(FaultyGrid(nodes(), RC))
    return state


def _copy(good, tmp_path):
    folder = tmp_path / "state"
    shutil.copytree(good, folder)
    return folder


def _refused(folder, what):
    """Resume from ``folder``: refused with the exact message, before any message is sent."""
    grid = FaultyGrid(nodes(), RC)
    sent = counting(grid)
    with pytest.raises(CheckpointDamaged) as err:
        strategy(resume=str(folder)).start(grid)
    assert str(err.value) == f"resume={str(folder)!r}: {folder / CHECKPOINT} is damaged ({what}){FIX}"
    assert isinstance(err.value, ValueError) and sent == []


def _rewrite(folder, edit):
    """Save the checkpoint again (a whole, readable file) after ``edit(arrays, header)``."""
    arrays, header = load_checkpoint(folder)
    arrays = dict(arrays)
    edit(arrays, header)
    save_checkpoint(folder, arrays, header)


def test_the_undamaged_checkpoint_loads(good):
    arrays, header = load_checkpoint(good)
    assert header["round"] == 8 and {"z", "y", "q", "b", "rq0", "rq1"} <= set(arrays)


def test_a_truncated_checkpoint(good, tmp_path):
    folder = _copy(good, tmp_path)
    path = folder / CHECKPOINT
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])
    _refused(folder, f"not a whole zip of arrays, {len(raw) // 2} bytes: File is not a zip file")


def test_a_flipped_byte_in_an_array(good, tmp_path):
    folder = _copy(good, tmp_path)
    path = folder / CHECKPOINT
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("a/z.npy")
    raw[info.header_offset + 30 + len(info.filename) + len(info.extra) + 200] ^= 0xFF   # inside z's data
    path.write_bytes(bytes(raw))
    _refused(folder, f"not a whole zip of arrays, {len(raw)} bytes: Bad CRC-32 for file 'a/z.npy'")


def test_an_empty_checkpoint(good, tmp_path):
    folder = _copy(good, tmp_path)
    (folder / CHECKPOINT).write_bytes(b"")
    _refused(folder, "the file is empty")


class _Trap:
    """Unpickling it would create ``sentinel``: the loader must never unpickle."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (open, (str(self.sentinel), "w"))


def test_a_pickle_is_refused_and_never_loaded(good, tmp_path):
    folder = _copy(good, tmp_path)
    sentinel = tmp_path / "unpickled"
    (folder / CHECKPOINT).write_bytes(pickle.dumps({"z": _Trap(sentinel)}))
    _refused(folder, "it holds pickled data, which is never loaded")
    assert not sentinel.exists()


def test_an_object_array_inside_the_zip_is_refused_and_never_loaded(good, tmp_path):
    folder = _copy(good, tmp_path)
    sentinel = tmp_path / "unpickled"
    buf = io.BytesIO()
    np.savez(buf, header=np.array('{"format": 1}'), **{"a/z": np.array([_Trap(sentinel)], dtype=object)})
    (folder / CHECKPOINT).write_bytes(buf.getvalue())
    _refused(folder, "it holds pickled data, which is never loaded")
    assert not sentinel.exists()


def test_an_array_missing(good, tmp_path):
    folder = _copy(good, tmp_path)
    _rewrite(folder, lambda a, h: a.pop("y"))
    _refused(folder, "the array 'y' is missing")


def test_a_replay_array_missing(good, tmp_path):
    folder = _copy(good, tmp_path)
    _rewrite(folder, lambda a, h: (a.pop("rq1"), a.pop("b")))
    _refused(folder, "the arrays 'b', 'rq1' are missing")


def test_a_header_field_missing(good, tmp_path):
    folder = _copy(good, tmp_path)
    _rewrite(folder, lambda a, h: h.pop("replay"))
    _refused(folder, "its header lacks replay")


def test_a_nan_in_z_is_named_not_blamed_on_a_party(good, tmp_path):
    folder = _copy(good, tmp_path)

    def nan(a, h):
        a["z"] = a["z"].copy()
        a["z"][[3, 9]] = [np.nan, np.inf]
    _rewrite(folder, nan)
    _refused(folder, "the array 'z' holds 2 NaN/inf values")


def test_an_array_of_another_length(good, tmp_path):
    folder = _copy(good, tmp_path)
    _rewrite(folder, lambda a, h: a.__setitem__("q", a["q"][:-1]))
    _refused(folder, "the array 'q' has shape (425,), z has (426,)")


def test_an_array_the_header_needs_later_is_named_too(good):
    """Arrays the resume reads beyond the required ones (an accelerator's, a party's last
    release) are a CheckpointDamaged naming the array, never a bare KeyError."""
    arrays, _ = load_checkpoint(good)
    with pytest.raises(CheckpointDamaged) as err:
        arrays["t_label_dp"]
    assert str(err.value) == (f"resume={str(good)!r}: {good / CHECKPOINT} is damaged (the array 't_label_dp' the "
                              f"checkpoint's header needs is missing){FIX}")
