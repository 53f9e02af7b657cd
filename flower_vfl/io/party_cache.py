"""A party's on-disk cache of its own parsed column blocks (no Flower imports, no math).

On real SuperNodes (flwr 1.41) every message runs in a fresh ``flwr-clientapp`` process, so
without this each message parsed the bundled data again: for a9a, reading both LIBSVM files and
slicing out the party's columns took 3-9 s of every round on a 2-core machine
(docs/benchmarks.md, "Latency of a round on real SuperNodes"); loading the cached block takes
milliseconds.

What is kept: the party's own ``(D_train, D_test)`` exactly as :func:`flower_vfl.io.data.party_block`
returns them (same class, dtypes and index arrays, so the privacy ledger's data fingerprint is
unchanged), in ``<state-dir>/block-cache/`` on the party's own disk beside its ledger: the same
trust domain as the data file it came from. Nothing else: no iterate, no noise, no model.

The file name is a SHA-256 over the dataset name, the party and the number of parties, the
content of the source files (a changed data file is a new key), and the source of the loader
modules (a changed parser is a new key). A file that fails its own checksum is ignored and
rewritten. ``FLOWER_VFL_BLOCK_CACHE=0`` turns the cache off.

What a message costs (every message on a real SuperNode is a new process): the SHA-256 of a
file's content is kept in ``<block-cache>/verified.json`` with the file's device, inode, size,
modification and change times (``st_ctime``, which every write and every ``utime`` moves and
which user code cannot set back), and reused while all five are unchanged, as git's index
does; a file changed within :data:`RACY_S` of being hashed is hashed again next time (a write
in the same time-stamp tick would keep its times). A block file's checksum is verified once
after it is written or changed, then its arrays are memory-mapped from the uncompressed npz
(no copy, no read of bytes the x-update does not touch), at the places recorded in
``verified.json`` with the block's stat key when it was written or checksummed (no zip
directory or ``.npy`` header parsed per message: ~1.5 ms of a forked ClientApp's 12-14 ms
handler); the opened file's own ``fstat`` must still match that key. At 3M rows x 4 parties this was ~1 s
of every party message (hash of the 185 MB source file 0.2-0.4 s, reading the 124 MB npz
0.6 s, its checksum 0.2 s); at a9a's size 10-19 ms.

A party's own files (docs/own-data.md) are cached the same way, aligned and preprocessed
(:func:`cached_own_block`, called by ``clients/psi_party.own_blocks``): the key
(:func:`own_block_key`) is what the party's node config declares (file, format, ID column,
columns, categorical, preprocessing), the SHA-256 of its files' content (a file rewritten in
place is read again, whatever its size or modification time: its change time moves), the row order the party agreed to at the PSI
step (its row indices and digest) and the loader's code. Parsing a9a's 32,561 rows from CSV and
scaling them cost 0.4-2.4 s of every own-data message on real SuperNodes; hashing the file and
loading the block costs ~0.1 s.

The folder is bounded: it keeps the :data:`MAX_FILES` most recently used blocks and deletes the
rest; an own-data source keeps one file (a new order or new content replaces it). The run config (the server's) names the dataset and ``num-parties``, so without a bound a
curious or malicious server could make the party write one block per value it sends (a9a:
``num-parties`` 1..123 would be ~5x the data on the party's disk).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
import time
import weakref
import zipfile
from pathlib import Path

import numpy as np

from flower_vfl.io.checkpoint import atomic_write
from flower_vfl.io.npy import read_npy_header

__all__ = ["cache_enabled", "block_cache_dir", "source_fingerprint", "cached_party_block", "own_block_key", "files_of",
           "cached_own_block", "verified_files", "block_digest", "served_blocks", "preload_blocks"]

#: bump when the file layout below changes
FORMAT = 1
#: blocks kept in the cache folder (least recently used deleted first)
MAX_FILES = 4
#: a file whose modification or change time is less than this many seconds before it was hashed
#: is hashed again next time (git's "racily clean" rule: a write within the same time-stamp tick)
RACY_S = 2.0
#: files whose digests ``verified.json`` keeps (the most recently verified)
MAX_VERIFIED = 64
VERIFIED = "verified.json"
#: the loader modules (beside this file) whose code is part of every key
_LOADER_SOURCES = ("data.py", "__init__.py", "sources.py", "preprocess.py", "bundled.py")
_HERE = Path(__file__).resolve().parent


def cache_enabled() -> bool:
    """False when ``FLOWER_VFL_BLOCK_CACHE`` is ``0``/``false``/``no``/``off``."""
    return os.environ.get("FLOWER_VFL_BLOCK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def block_cache_dir(state_dir=None) -> Path:
    """``<state-dir>/block-cache`` (the party's own state folder, as for its ledger)."""
    if not state_dir:
        from flower_vfl.privacy.store import default_state_dir
        state_dir = default_state_dir()
    return Path(state_dir) / "block-cache"


def _sha_file(h, path: Path, verified: "_Verified | None" = None) -> None:
    """``name|size|`` and the content's SHA-256 into ``h``; with ``verified``, the content digest
    kept for the file's unchanged stat, else computed (and kept when the file is not racy)."""
    h.update(f"{path.name}|{path.stat().st_size}|".encode())
    h.update((verified.content_digest(path) if verified is not None else _content_digest(path)).encode())


def _content_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(path: Path, ctime: bool = True) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
    return key + [st.st_ctime_ns] if ctime else key


class _Verified:
    """What the party already checked on its own disk, by file: ``verified.json`` in its block
    cache folder, ``{path: [dev, ino, size, mtime_ns, ctime_ns, value]}``. A source file's value
    is its content's SHA-256 (not kept while racy); a block file's is ``"ok"`` (its checksum
    held, or this process wrote it; the recency touch, which moves its change time, records the
    new one). Lost updates between processes only cost a hash; a missing or unreadable file is
    an empty one."""

    def __init__(self, folder: Path):
        self.path = folder / VERIFIED
        self.changed = False
        try:
            got = json.loads(self.path.read_text())
            self.files = {str(k): list(v) for k, v in got.items() if isinstance(v, list)} \
                if isinstance(got, dict) else {}
        except (OSError, ValueError):
            self.files = {}

    def _get(self, path: Path, ctime: bool):
        key = _stat_key(path, ctime)
        row = self.files.get(str(path))
        return key, (row[-1] if key is not None and row is not None and row[:-1] == key else None)

    def _put(self, path: Path, key, value) -> None:
        self.files.pop(str(path), None)
        self.files[str(path)] = list(key) + [value]
        while len(self.files) > MAX_VERIFIED:
            self.files.pop(next(iter(self.files)))
        self.changed = True

    def content_digest(self, path: Path) -> str:
        t0 = time.time_ns()
        key, digest = self._get(path, ctime=True)
        if isinstance(digest, str):
            return digest
        digest = _content_digest(path)
        after = _stat_key(path, ctime=True)
        if key is not None and after == key and t0 - max(key[3], key[4]) > RACY_S * 1e9:
            self._put(path, key, digest)
        return digest

    def block_ok(self, path: Path) -> bool:
        return self.block_check(path)[0] is not None

    def block_check(self, path: Path):
        """``(key, layout)``: the stat key of a block file whose checksum held and that has not
        changed since (else ``(None, None)``), and its arrays' places in the file as
        :func:`_mapped_npz` found them at an earlier mapped read of that same, unchanged file
        (None: not recorded yet)."""
        key, value = self._get(path, ctime=True)
        if value == "ok":
            return key, None
        if isinstance(value, list) and len(value) == 2 and value[0] == "ok" and isinstance(value[1], dict):
            return key, value[1]
        return None, None

    def mark_block(self, path: Path, was=None, layout=None) -> None:
        """``path`` holds a verified block; with ``was`` (its stat key before a touch), only when
        nothing but its access and change times moved since (a layout recorded for it is kept: the
        bytes did not move). ``layout``: its arrays' places, recorded with the key ``was`` (the
        stat the mapped read checked on the open file) only when the file still has it; without
        either (the block was just written or checksummed), found here in the file as it is now."""
        key = _stat_key(path, ctime=True)
        if key is None or (was is not None and key[:4] != was[:4]):
            return
        if layout is not None:
            if key != list(was):
                return
        elif was is not None:
            layout = self._layout_of(path, was)
        else:
            got = _mapped_npz(path, key)
            layout = None if got is None else got[1]
        self._put(path, key, "ok" if layout is None else ["ok", layout])

    def _layout_of(self, path: Path, was):
        row = self.files.get(str(path))
        if row is None or row[:-1] != list(was):
            return None
        value = row[-1]
        return value[1] if isinstance(value, list) and len(value) == 2 and value[0] == "ok" else None

    def forget(self, path: Path) -> None:
        if self.files.pop(str(path), None) is not None:
            self.changed = True

    def save(self) -> None:
        """Atomically, when something changed; a read-only folder only costs speed."""
        if not self.changed:
            return
        text = json.dumps(self.files).encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, lambda fh: fh.write(text), durable=False)   # lost on a crash: a rehash
            self.changed = False
        except OSError:
            pass


def _source_files(name: str, data_dir) -> list[Path] | None:
    """The files a bundled dataset is parsed from (:func:`flower_vfl.io.data.source_files`); None
    when one is missing or the name is not a bundled dataset (no caching: the fresh load then
    raises its own error or writes the file first)."""
    from flower_vfl.io.data import source_files
    try:
        files = source_files(name, data_dir)
    except ValueError:
        return None
    return files if all(f.is_file() for f in files) else None


def source_fingerprint(name: str, party: int, num_parties: int, data_dir=None, verified=None) -> str | None:
    """The cache key: SHA-256 of the request, the source files' content and the loader's code
    (and, for breast_cancer, the scikit-learn version that splits it). None: not cacheable.
    ``verified``: the content digests kept by stat (:class:`_Verified`)."""
    files = _source_files(name, data_dir)
    if files is None:
        return None
    h = hashlib.sha256(f"flower-vfl block cache v{FORMAT}|{name}|{int(party)}|{int(num_parties)}|".encode())
    for f in files:
        _sha_file(h, f, verified)
    for rel in _LOADER_SOURCES:
        p = _HERE / rel
        if p.is_file():
            _sha_file(h, p, verified)
    if name == "breast_cancer":        # train_test_split(random_state=0) is sklearn's
        from importlib.metadata import version
        h.update(f"|sklearn {version('scikit-learn')}|numpy {np.__version__}".encode())
    return h.hexdigest()


# ------------------------------------------------------------------ file layout
def _pack(prefix: str, M, out: dict) -> None:
    if hasattr(M, "tocsr"):
        if M.format != "csr":
            raise TypeError(f"block of format {M.format!r}; only CSR blocks are cached")
        out[f"{prefix}.kind"] = np.array(type(M).__name__)
        out[f"{prefix}.shape"] = np.array(M.shape, dtype=np.int64)
        out[f"{prefix}.data"], out[f"{prefix}.indices"], out[f"{prefix}.indptr"] = M.data, M.indices, M.indptr
        out[f"{prefix}.sorted"] = np.array(bool(M.has_sorted_indices))
    else:
        out[f"{prefix}.kind"] = np.array("ndarray")
        out[f"{prefix}.data"] = np.asarray(M)


def _unpack(prefix: str, f):
    kind = str(f[f"{prefix}.kind"])
    if kind == "ndarray":
        return np.array(f[f"{prefix}.data"])
    import scipy.sparse as sp
    cls = {"csr_matrix": sp.csr_matrix, "csr_array": getattr(sp, "csr_array", sp.csr_matrix)}[kind]
    shape = tuple(int(s) for s in f[f"{prefix}.shape"])
    M = cls(shape, dtype=f[f"{prefix}.data"].dtype)
    # set the arrays as stored: the constructor may change the index dtype, and the ledger's
    # fingerprint covers dtypes
    M.data, M.indices, M.indptr = f[f"{prefix}.data"], f[f"{prefix}.indices"], f[f"{prefix}.indptr"]
    M.has_sorted_indices = bool(f[f"{prefix}.sorted"])
    return M


def _digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")     # a zip member's local file header (30 bytes)


def _mapped_npz(path: Path, expect=None, layout=None):
    """The arrays of an uncompressed npz (``np.savez``) as read-only views of one memory map of
    the file, without reading their bytes, and their places in it (``{name: [offset, dtype,
    shape, fortran]}``); None when a member is compressed, not a plain ``.npy`` of a dtype without
    objects, or does not fit in its member (the caller then reads it with ``np.load``). The map
    lives as long as any of the arrays.

    ``expect``: the stat key (:func:`_stat_key`, change time included) the file had when its
    checksum was verified: the file as opened must still have it (else None: a file replaced or
    written since is read and checked again). ``layout``: the places recorded at an earlier
    mapped read of the file with that same stat key, used instead of parsing the zip directory
    and the ``.npy`` headers again (an entry that does not fit in the file: None)."""
    import mmap
    try:
        with open(path, "rb") as fh:
            if expect is not None and _fstat_key(fh.fileno()) != list(expect):
                return None
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(mm)
        if layout is not None:
            out = {}
            for name, (offset, dtype, shape, fortran) in layout.items():
                dtype, shape = np.dtype(str(dtype)), tuple(int(n) for n in shape)
                count = math.prod(shape)
                if dtype.hasobject or min(shape, default=0) < 0 \
                        or not 0 <= int(offset) <= len(buf) - count * dtype.itemsize:
                    return None
                a = np.frombuffer(buf, dtype=dtype, count=count, offset=int(offset))
                out[str(name)] = a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
            return out, layout
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
        out, places = {}, {}
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                return None
            head = _LOCAL_HEADER.unpack_from(buf, info.header_offset)
            if head[0] != b"PK\x03\x04":
                return None
            start = info.header_offset + _LOCAL_HEADER.size + head[-2] + head[-1]
            end = start + info.file_size
            if end > len(buf):
                return None
            member = io.BytesIO(buf[start:min(end, start + (1 << 16))])
            shape, fortran, dtype, header_end = read_npy_header(member, max_header_size=1 << 16)
            if dtype.hasobject:
                return None
            offset = start + header_end
            count = math.prod(shape)
            if offset + count * dtype.itemsize != end:
                return None
            a = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
            out[info.filename[:-4]] = a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
            places[info.filename[:-4]] = [offset, dtype.str, list(shape), bool(fortran)]
        return out, places
    except (OSError, ValueError, EOFError, KeyError, TypeError, struct.error, zipfile.BadZipFile):
        return None


def _fstat_key(fd: int) -> list:
    st = os.fstat(fd)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_arrays(path: Path, verified: "_Verified | None" = None, checksum: list | None = None):
    """The arrays of a cache file whose checksum holds, else None. With ``verified``: a file whose
    checksum held before and that has not changed since (its stat key, change time included,
    checked on the opened file) is memory-mapped without hashing it; from the second such read
    on, at the places the first one recorded for that stat key (no zip or ``.npy`` header
    parsed). ``checksum``: a list the file's checksum (:func:`_digest` of its arrays) is
    appended to."""
    if verified is not None:
        key, layout = verified.block_check(path)
        got = _mapped_npz(path, key, layout) if key is not None else None
        if got is not None and "checksum" in got[0]:
            arrays, places = got
            if layout is None:
                verified.mark_block(path, key, places)
            if checksum is not None:
                checksum.append(str(arrays["checksum"]))
            arrays.pop("checksum")
            return arrays
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    digest = str(arrays.pop("checksum", ""))
    if digest != _digest(arrays):
        if verified is not None:
            verified.forget(path)
        return None                       # torn or tampered file: parse again
    if verified is not None:
        verified.mark_block(path)
    if checksum is not None:
        checksum.append(digest)
    return arrays


def _read(path: Path, verified=None):
    checksum: list = []
    arrays = _read_arrays(path, verified, checksum)
    if arrays is None:
        return None
    return _remember(checksum[0], _unpack("train", arrays),
                     None if "test.kind" not in arrays else _unpack("test", arrays))


#: id(block) -> (a weak reference to it, its content digest): the blocks this module returned
_DIGESTS: dict[int, tuple] = {}


def _remember(checksum: str, *blocks):
    """``blocks`` (train, test[, extra]) as returned; each train / test block's content digest
    (:func:`block_digest`) recorded as the cache file's checksum and its part."""
    for part, M in zip(("train", "test"), blocks):
        if M is None:
            continue
        try:
            ref = weakref.ref(M, lambda _r, k=id(M): _DIGESTS.pop(k, None))
        except TypeError:
            continue
        _DIGESTS[id(M)] = (ref, f"{checksum}:{part}")
    return blocks


def block_digest(M) -> str | None:
    """For a block this cache returned (the very object), a digest of its content: the SHA-256
    its cache file carries over the block's arrays (:func:`_digest`: every array's name, dtype,
    shape and bytes), checked when the file was written or read (the checksum, then the file's
    SHA-256 with its stat as ``verified.json`` keeps them), and the part (``train``/``test``);
    None for any other object. The block is shared: callers do not modify it in place (a mapped
    block is read-only)."""
    got = _DIGESTS.get(id(M))
    return got[1] if got is not None and got[0]() is M else None


def _write(path: Path, D, D_test, extra=None, verified=None) -> str:
    arrays: dict = {}
    _pack("train", D, arrays)
    if D_test is not None:
        _pack("test", D_test, arrays)
    for k, v in (extra or {}).items():
        arrays[f"extra.{k}"] = np.asarray(v)
    arrays["checksum"] = np.array(_digest(arrays))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: np.savez(fh, **arrays))    # a concurrent reader sees a whole file
    if verified is not None:                   # written and synced from the arrays its checksum is of
        verified.mark_block(path)
    return str(arrays["checksum"])


def _touch(path: Path, verified: "_Verified | None" = None) -> None:
    """"Recently used" for :func:`_evict`: the access time, the modification time kept. A block
    ``verified`` held stays verified (the touch moved only its access and change times). A block
    that is already the most recently used of its folder is left as it is (the order
    :func:`_evict` reads is the same): a touch moves its change time, so every message of a run
    wrote ``verified.json`` again."""
    try:
        mine = _used(path)
        if all(_used(f) < mine for f in _blocks(path.parent) if f != path):
            return
        was = _stat_key(path, ctime=True)
        ok = verified is not None and verified.block_ok(path)
        os.utime(path, ns=(time.time_ns(), was[3]))
        if ok:
            verified.mark_block(path, was)
    except (OSError, TypeError):
        pass


def _blocks(folder: Path) -> list[Path]:
    """The block files in ``folder`` (``*.npz``; listed without a glob's pattern compiled anew in
    every message's process)."""
    try:
        return [folder / n for n in os.listdir(folder) if n.endswith(".npz")]
    except OSError:
        return []


def _used(f: Path) -> int:
    """When a block was last used (:func:`_touch`) or written, in ns (0: gone)."""
    try:
        st = f.stat()
        return max(st.st_atime_ns, st.st_mtime_ns)
    except OSError:
        return 0


def _evict(folder: Path, keep: Path) -> None:
    """Delete all but the MAX_FILES most recently used blocks (never ``keep``)."""
    files = sorted(folder.glob("*.npz"), key=_used, reverse=True)
    kept = [keep] + [f for f in files if f != keep][: MAX_FILES - 1]
    for f in files:
        if f not in kept:
            f.unlink(missing_ok=True)


#: blocks already returned in this process (a simulation actor serves many messages; a warm
#: executor's forked ClientApps inherit its entries: :func:`preload_blocks`), keyed by the request
#: and the source files' stat keys (change time included): ``(D, D_test, path, key)``, where
#: ``key`` is the block file's stat key (:func:`_stat_key`) when its checksum was known to hold
#: (a hit needs the file to have it still; None: a block parsed but not written, or unverified)
_MEMO: dict = {}
#: the requests this process served from a verified block file (:func:`served_blocks`)
_SERVED: list = []
#: at most this many requests are reported and preloaded (a run names one; the bound is for a
#: server that varies ``num-parties``)
MAX_PRELOAD = 4


def _memo_key(name, party, num_parties, data_dir, state_dir, files):
    return (name, int(party), int(num_parties), data_dir, str(block_cache_dir(state_dir)),
            tuple((str(f), *(_stat_key(f) or ())) for f in files))


def _memo_hit(memo):
    got = _MEMO.get(memo)
    if got is None:
        return None
    D, D_test, path, key = got
    if path is None or (key is not None and _stat_key(path, ctime=True) == key):
        return D, D_test
    _MEMO.pop(memo, None)                      # the block file changed since: read and check it again
    return None


def _memo_put(memo, got, path=None, key=None) -> None:
    _MEMO.pop(memo, None)
    while len(_MEMO) >= 8:                     # bounded: the oldest request goes first
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[memo] = (got[0], got[1], path, key)


def cached_party_block(name: str, party: int, num_parties: int, data_dir=None, state_dir=None):
    """:func:`flower_vfl.io.data.party_block`, through the party's block cache when it is enabled
    and the source files exist. Returns ``(D_train, D_test)``, bitwise those of a fresh parse
    (shared objects: callers must not modify them in place)."""
    from flower_vfl.io.data import party_block
    data_dir = None if data_dir in (None, "") else str(data_dir)
    files = _source_files(name, data_dir) if cache_enabled() else None
    if files is None:
        return party_block(name, party, num_parties, data_dir)
    memo = _memo_key(name, party, num_parties, data_dir, state_dir, files)
    hit = _memo_hit(memo)
    if hit is not None:
        return hit
    folder = block_cache_dir(state_dir)
    verified = _Verified(folder)
    key = source_fingerprint(name, party, num_parties, data_dir, verified)
    stem = f"{name}-p{int(party)}of{int(num_parties)}-"
    path = folder / f"{stem}{key[:32]}.npz"
    got = _read(path, verified) if path.is_file() else None
    if got is not None:
        _touch(path, verified)
    else:
        got = party_block(name, party, num_parties, data_dir)
        try:
            _remember(_write(path, *got, verified=verified), *got)
            for old in folder.glob(f"{stem}*.npz"):     # blocks of data that has changed since
                if old != path:
                    old.unlink(missing_ok=True)
            _evict(folder, keep=path)
        except (OSError, TypeError):
            pass                               # a read-only state dir only costs speed
    verified.save()
    bkey = verified.block_check(path)[0]
    _memo_put(memo, got, path if path.is_file() else None, bkey)     # no file (read-only folder): kept as parsed
    if bkey is not None:
        req = [name, int(party), int(num_parties), data_dir, None if not state_dir else str(state_dir)]
        if req not in _SERVED:
            _SERVED.append(req)
            del _SERVED[:-MAX_PRELOAD]
    return got


def served_blocks() -> list:
    """The requests (``[name, party, num_parties, data_dir, state_dir]``) this process served from a
    verified block file: what a warm executor's forked ClientApp reports to it
    (:mod:`flower_vfl.deploy.warm_exec`), for :func:`preload_blocks`."""
    return [list(r) for r in _SERVED]


def preload_blocks(requests) -> int:
    """In a warm executor (the party's own process, not a message's): map the blocks its forked
    ClientApps were served (``requests`` as :func:`served_blocks` gave them), so that the next
    children are forked with them in :data:`_MEMO`. Only a block whose checksum is already known
    to hold for its file's current stat key (``verified.json``) and whose source files' digests
    are kept is mapped; nothing is parsed, hashed or written here. A child uses an entry only for
    the very request it computes itself (from its node config and the run, as before) and only
    while the block file and the source files keep the stat keys (change time included) they had
    here; else it reads and checks the block as without the entry. Returns how many were mapped."""
    if not cache_enabled() or not isinstance(requests, list):
        return 0
    done = 0
    for req in requests[:MAX_PRELOAD]:
        if not (isinstance(req, list) and len(req) == 5 and isinstance(req[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in req[1:3])
                and all(v is None or isinstance(v, str) for v in req[3:])):
            continue
        name, party, num_parties, data_dir, state_dir = req
        try:
            files = _source_files(name, data_dir)
            if files is None:
                continue
            memo = _memo_key(name, party, num_parties, data_dir, state_dir, files)
            if _memo_hit(memo) is not None:
                continue
            folder = block_cache_dir(state_dir)
            verified = _Verified(folder)
            kept = list(files) + [_HERE / rel for rel in _LOADER_SOURCES if (_HERE / rel).is_file()]
            if not all(isinstance(verified._get(f, True)[1], str) for f in kept):
                continue                           # a source digest not kept: the child hashes it
            key = source_fingerprint(name, party, num_parties, data_dir, verified)
            path = folder / f"{name}-p{int(party)}of{int(num_parties)}-{key[:32]}.npz"
            bkey, layout = verified.block_check(path)
            if bkey is None:
                continue                           # not verified for its current stat: the child checks it
            got = _mapped_npz(path, bkey, layout)
            if got is None or "checksum" not in got[0]:
                continue
            arrays = got[0]
            blocks = _remember(str(arrays.pop("checksum")), _unpack("train", arrays),
                               None if "test.kind" not in arrays else _unpack("test", arrays))
            if memo == _memo_key(name, party, num_parties, data_dir, state_dir, files):
                _memo_put(memo, blocks, path, bkey)
                done += 1
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return done


# ------------------------------------------------------------------ own data (clients/psi_party.py)
#: own-data blocks already returned in this process, by their key (bounded like _MEMO)
_OWN_MEMO: dict = {}


def files_of(src) -> list[Path]:
    """The files a party's own source is parsed from: the data file, and a LIBSVM file's ID sidecar."""
    files = [Path(src.path)]
    if src.resolved_format() == "libsvm":
        files.append(Path(src.id_path or src.path + ".ids"))
    return files


def verified_files(state_dir=None) -> "_Verified | None":
    """The digests and checks kept in ``state_dir``'s block cache (``verified.json``, read once
    here), for one message's :func:`own_block_key` and :func:`cached_own_block`; None when the
    cache is off."""
    return _Verified(block_cache_dir(state_dir)) if cache_enabled() else None


def own_block_key(sources, code_files=(), state_dir=None, memo: bool = False, verified=None) -> str | None:
    """The cache key of a party's aligned, preprocessed own-data block: SHA-256 over, per split,
    the source as its node config declares it (``SourceConfig``: path, format, ID column,
    columns, categorical, preprocessing ...), the *content* of its files (a file rewritten in
    place, whatever its size or time stamps, is a new key), the aligned row indices and the
    agreed order's digest the party stored at the PSI step; and over the loader's code
    (``code_files`` too) and the parsing library's version. ``sources``: ``[(split, SourceConfig,
    idx, order_digest)]``. None when a file is missing (no caching: the fresh read raises its
    DataError). With ``memo``: the content digests kept by stat in the block cache of
    ``state_dir`` (:class:`_Verified`; a file written since, in place or not, moves its change
    time and is hashed again); ``verified``: those digests as :func:`verified_files` read them
    (then not read again here)."""
    from importlib.metadata import PackageNotFoundError, version
    if verified is None and memo and cache_enabled():
        verified = _Verified(block_cache_dir(state_dir))
    h = hashlib.sha256(f"flower-vfl own block v{FORMAT}|numpy {np.__version__}|".encode())
    for split, src, idx, digest in sources:
        files = files_of(src)
        if not all(f.is_file() for f in files):
            return None
        lib = "scikit-learn" if src.resolved_format() == "libsvm" else "pyarrow"
        try:
            lib = f"{lib} {version(lib)}"
        except PackageNotFoundError:
            pass
        h.update(f"|{split}|{src!r}|{lib}|{digest}|".encode())
        for f in files:
            _sha_file(h, f, verified)
        a = np.ascontiguousarray(np.asarray(idx, dtype=np.int64))
        h.update(f"|idx {a.shape}|".encode())
        h.update(a.tobytes())
    for p in [_HERE / rel for rel in _LOADER_SOURCES] + [Path(c) for c in code_files]:
        if p.is_file():
            _sha_file(h, p, verified)
    if verified is not None:
        verified.save()
    return h.hexdigest()


def cached_own_block(key: str | None, source_path: str, id_column: str, build, state_dir=None, verified=None):
    """``build()`` -> ``(D, D_test, extra)`` (``extra``: a dict of plain numpy arrays), through the
    party's block cache under ``key`` (:func:`own_block_key`; None or the cache turned off: built
    afresh). Returns the same triple, bitwise that of ``build()``.

    Bounded as the bundled blocks are: one file per declared source (``source_path`` and its ID
    column; a new key for it replaces the old file) and :data:`MAX_FILES` files in the folder.
    The agreed order is the central node's choice: a new order only replaces that source's file.
    ``verified``: the block cache's checks as :func:`verified_files` read them for this message
    (else ``verified.json`` is read here)."""
    if key is None or not cache_enabled():
        return build()
    folder = block_cache_dir(state_dir)
    memo = (str(folder), key)
    if memo in _OWN_MEMO:
        return _OWN_MEMO[memo]
    stem = "own-" + hashlib.sha256(f"{source_path}|{id_column}".encode()).hexdigest()[:16] + "-"
    path = folder / f"{stem}{key[:32]}.npz"
    if verified is None:
        verified = _Verified(folder)
    checksum: list = []
    arrays = _read_arrays(path, verified, checksum) if path.is_file() else None
    if arrays is not None:
        _touch(path, verified)
        got = _remember(checksum[0], _unpack("train", arrays),
                        None if "test.kind" not in arrays else _unpack("test", arrays),
                        {k[len("extra."):]: v for k, v in arrays.items() if k.startswith("extra.")})
    else:
        got = build()
        try:
            _remember(_write(path, *got, verified=verified), *got)
            for old in folder.glob(f"{stem}*.npz"):     # this source's block for other data or order
                if old != path:
                    old.unlink(missing_ok=True)
            _evict(folder, keep=path)
        except (OSError, TypeError):
            pass                               # a read-only state dir only costs speed
    verified.save()
    while len(_OWN_MEMO) >= 4:
        _OWN_MEMO.pop(next(iter(_OWN_MEMO)))
    _OWN_MEMO[memo] = got
    return got
