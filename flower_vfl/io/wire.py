"""A small message's arrays in one config record: fewer Flower objects per round.

Flower moves a message as a tree of objects (the message, its RecordDict, each record, each
Array and each Array's chunks), and on real nodes every object is its own request in each of
the message's hops: the central node's push to the SuperLink, the SuperNode's pull, the
ClientApp's pull from its node, and back. A round's request (two N-vectors in an ArrayRecord,
the scalars in a ConfigRecord) is 7 objects and a party's reply 5; the same bytes as ``bytes``
values of one ConfigRecord are 2 and 3. On loopback real nodes with TLS that was 0.59-0.63 s
against 0.79-0.85 s for Flower's own empty app's round trip with a9a's payload
(docs/benchmarks.md, "Fewer objects a message").

:func:`pack` moves every array of every ArrayRecord ``R`` into the ConfigRecord ``into`` as the
key ``"R/k"``, holding Flower's own serialization of the array (``Array.data``: NumPy's ``.npy``
format); :func:`unpack` is its inverse and checks what it reads (NumPy's ``.npy`` header reader:
numeric dtypes only, the size the header declares; Flower's own ``Array.numpy()`` reads the values,
``allow_pickle=False``; no key in two places). Only contents of at most
:data:`PACK_MAX_BYTES` of array data are packed: above it a message's bytes, not its object
count, are the cost, and Flower's chunking of large Arrays is kept.

Who packs: the central node's exchange packs a request only for a node whose identify reply
listed the message type in :data:`PACKED_FIELD` (a party of this package's
:class:`~flower_vfl.clients.party_base.PartyClient`: ``train`` and ``evaluate``), and such a party
packs its reply only when the request was packed. Any other app sees Flower's usual records.
"""

from __future__ import annotations

import io

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from flower_vfl.io.npy import read_npy_header

__all__ = ["PACK_MAX_BYTES", "PACKED_FIELD", "PACK_SEP", "PACK_REQUEST_INTO", "PACK_REPLY_INTO", "pack", "unpack",
           "packed_types", "is_packed"]

#: contents with more array bytes than this travel as Flower's ArrayRecords (below Flower's
#: 5 MiB Array chunk: a packed value is never larger than one of Flower's own objects)
PACK_MAX_BYTES = 4 << 20
#: the identify reply's key listing the message types a party reads packed ("train,evaluate")
PACKED_FIELD = "packed_types"
#: the record a packed request's arrays travel in (its scalars' record), and a packed reply's
PACK_REQUEST_INTO, PACK_REPLY_INTO = "config", "packed"
#: record name / array key separator of a packed key ("vectors/q")
PACK_SEP = "/"
#: the array dtypes a packed value may hold (the wire floats and a masked release's uint64)
_DTYPES = ("float64", "float32", "uint64", "int64")


def _array_bytes(content: RecordDict) -> int:
    return sum(len(rec[k].data) for rec in content.array_records.values() for k in rec)


def pack(content: RecordDict, into: str, max_bytes: int = PACK_MAX_BYTES) -> RecordDict:
    """``content`` with its ArrayRecords moved into the ConfigRecord ``into`` (created when
    absent), or ``content`` itself when it has no ArrayRecord or more than ``max_bytes`` of
    array data. Every other record is the same object."""
    arrays = content.array_records
    if not arrays or _array_bytes(content) > max_bytes:
        return content
    base = dict(content.config_records[into]) if into in content.config_records else {}
    if into in content and into not in content.config_records:
        raise ValueError(f"cannot pack into record {into!r}: it is not a ConfigRecord")
    for name, rec in arrays.items():
        for key in rec:
            packed_key = f"{name}{PACK_SEP}{key}"
            if packed_key in base:
                raise ValueError(f"cannot pack: record {into!r} already has the key {packed_key!r}")
            base[packed_key] = bytes(rec[key].data)
    out = {}
    for name, rec in content.items():
        if name in arrays:
            continue
        out[name] = ConfigRecord(base) if name == into else rec
    if into not in out:
        out[into] = ConfigRecord(base)
    return RecordDict(out)


def is_packed(content, into: str) -> bool:
    """Whether the record ``into`` of ``content`` holds packed arrays."""
    if into not in content.config_records:
        return False
    return any(PACK_SEP in k for k in content.config_records[into])


def unpack(content: RecordDict, into: str, error: type[Exception], who: str) -> RecordDict:
    """The inverse of :func:`pack`: ``content`` with the packed keys of ``into`` as ArrayRecords
    again (``content`` itself when there are none; ``into`` is dropped when only packed keys were
    in it). A value that is not ``.npy`` bytes of a numeric array, or an ArrayRecord the content
    also has, raises ``error`` naming ``who`` and the field."""
    if not is_packed(content, into):
        return content
    rest, arrays = {}, {}
    for key, value in content.config_records[into].items():
        if PACK_SEP not in key:
            rest[key] = value
            continue
        name, _, akey = key.partition(PACK_SEP)
        field = f"{into}.{key}"
        if not name or not akey:
            raise error(f"{who}: packed field {field!r} does not name a record and an array ('record/key')")
        if name in content:
            raise error(f"{who}: packed field {field!r} names record {name!r}, which the message also has; "
                        "refused (one place per array)")
        if not isinstance(value, bytes):
            raise error(f"{who}: packed field {field!r} is a {type(value).__name__}, not bytes")
        arrays.setdefault(name, {})[akey] = _read_npy(value, field, error, who)
    out = {}
    for name, rec in content.items():
        if name == into:
            if rest:
                out[name] = ConfigRecord(rest)
        else:
            out[name] = rec
    for name, recs in arrays.items():
        out[name] = ArrayRecord(recs)
    return RecordDict(out)


def _read_npy(value: bytes, field: str, error: type[Exception], who: str) -> Array:
    """The Flower Array of ``.npy`` bytes, its header read by NumPy's own reader first: a dtype
    among the numeric ones, and exactly as many bytes after the header as its shape says (nothing
    is allocated for a size the bytes do not hold). The bytes are then the Array's own data, read
    by Flower's ``Array.numpy()`` (NumPy's reader, ``allow_pickle=False``) where they are used."""
    fp = io.BytesIO(value)
    try:
        shape, _, dtype, offset = read_npy_header(fp)
    except Exception as exc:      # not .npy bytes
        raise error(f"{who}: packed field {field!r} is not a NumPy array ({exc})") from None
    if dtype.name not in _DTYPES:
        raise error(f"{who}: packed field {field!r} has dtype {dtype}; expected one of {', '.join(_DTYPES)}")
    count = int(np.prod(shape, dtype=object))
    if count * dtype.itemsize != len(value) - offset:
        raise error(f"{who}: packed field {field!r} declares shape {tuple(shape)} ({count * dtype.itemsize} bytes) "
                    f"but holds {len(value) - offset} bytes after its header")
    return Array(dtype=str(dtype), shape=tuple(int(n) for n in shape), stype="numpy.ndarray", data=value)


def packed_types(info) -> frozenset:
    """The message types an identify reply's record ``info`` says its party reads packed."""
    try:
        raw = info.get(PACKED_FIELD, "") if hasattr(info, "get") else ""
    except Exception:
        return frozenset()
    if not isinstance(raw, str):
        return frozenset()
    return frozenset(t.strip() for t in raw.split(",") if t.strip())
