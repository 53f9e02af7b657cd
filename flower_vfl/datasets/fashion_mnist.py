"""Fashion-MNIST from the IDX files installed by Debian's ``dataset-fashion-mnist``."""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["FASHION_MNIST_DIR", "load_fashion_mnist"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
_INSTALL = "sudo apt-get install dataset-fashion-mnist (or: bash scripts/install.sh)"


def _open(path: Path):
    for p in (path, path.with_name(path.name + ".gz")):
        if p.is_file():
            return gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")
    raise FileNotFoundError(f"Fashion-MNIST file {path.name}[.gz] not found in {path.parent}; "
                            f"install it with `{_INSTALL}` or pass data_dir=<folder with the IDX files>")


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (magic 0x0000 08 <ndim>, big-endian dims, uint8 payload)."""
    with _open(path) as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(int)
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {arr.size} bytes of payload, header says {tuple(dims)}")
    return arr.reshape(tuple(dims))


@lru_cache(maxsize=2)
def load_fashion_mnist(data_dir: str | None = None):
    """(X_train (60000, 784), y_train, X_test (10000, 784), y_test); pixels scaled to [0, 1].

    ``data_dir``: a folder with the four IDX files (gzipped or not); default the Debian
    package's ``/usr/share/datasets/fashion-mnist``.
    """
    d = Path(data_dir) if data_dir else FASHION_MNIST_DIR
    out = []
    for split in ("train", "test"):
        img, lab = (_read_idx(d / name) for name in _FILES[split])
        out += [img.reshape(img.shape[0], -1).astype(np.float64) / 255.0, lab.astype(np.int64)]
    return tuple(out)
