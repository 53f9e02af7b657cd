"""NumPy's ``.npy`` header, read by NumPy's own reader (no Flower imports, no math).

One helper for the two places that read a ``.npy`` header before its data: a packed message
field (:func:`flower_vfl.io.wire.unpack`) and a memory-mapped block cache member
(:mod:`flower_vfl.io.party_cache`).
"""

from __future__ import annotations

from numpy.lib import format as _fmt

__all__ = ["read_npy_header"]


def read_npy_header(fp, max_header_size: int | None = None):
    """``(shape, fortran_order, dtype, offset)`` of the ``.npy`` bytes at ``fp``'s position:
    NumPy's ``read_magic``, then its version 1.0 header reader for version (1, 0) and its 2.0
    reader otherwise; ``offset`` is ``fp.tell()`` after the header (where the data starts).
    Whatever NumPy raises is raised; ``max_header_size``, when given, is passed to the reader
    (else NumPy's default)."""
    version = _fmt.read_magic(fp)
    read_header = _fmt.read_array_header_1_0 if version == (1, 0) else _fmt.read_array_header_2_0
    kwargs = {} if max_header_size is None else {"max_header_size": max_header_size}
    shape, fortran_order, dtype = read_header(fp, **kwargs)
    return shape, fortran_order, dtype, fp.tell()
