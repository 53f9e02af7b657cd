"""Horizontal splits with flwr-datasets' partitioners (what a Flower user already uses).

The arrays become a local ``datasets.Dataset`` (column ``x`` holds the row index into the
caller's array, ``label`` the class), the partitioner assigns rows to agents, and each agent
gets its rows back as arrays. Partitioning by index keeps the 60000 x 784 pixels out of
Arrow; an agent of a real deployment calls :func:`agent_partition` with its own
``partition-id`` and loads nothing else.
"""

from __future__ import annotations

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["split_indices", "split_arrays", "agent_partition", "fashion_mnist_split"]


class MissingExtraError(UserError, ImportError):
    """The horizontal reproduction's optional dependencies are not installed."""


def _require_flwr_datasets():
    """flwr-datasets (and the ``datasets`` it brings) or a :class:`MissingExtraError` naming the extra:
    only the horizontal reproduction splits with it, so a plain install leaves it out."""
    try:
        import datasets  # noqa: F401
        import flwr_datasets.partitioner as partitioner
    except ImportError as exc:
        raise MissingExtraError(f"the horizontal reproduction splits Fashion-MNIST with flwr-datasets, which is not "
                                f"installed ({exc}): pip install 'flower-vfl[horizontal]' (from a checkout: "
                                "pip install -e '.[horizontal]')") from None
    return partitioner


def _partitioner(kind: str, num_agents: int, alpha: float, seed: int):
    partitioner = _require_flwr_datasets()
    DirichletPartitioner, IidPartitioner = partitioner.DirichletPartitioner, partitioner.IidPartitioner
    if kind == "iid":
        return IidPartitioner(num_partitions=num_agents)
    if kind == "dirichlet":
        return DirichletPartitioner(num_partitions=num_agents, partition_by="label", alpha=alpha,
                                    min_partition_size=10, self_balancing=False, shuffle=True, seed=seed)
    raise ValueError(f"split={kind!r}; choose 'iid' or 'dirichlet'")


def split_indices(y, num_agents: int, kind: str = "iid", alpha: float = 0.5, seed: int = 42) -> list[np.ndarray]:
    """Row indices of every agent's partition of labels ``y``.

    ``iid``: :class:`flwr_datasets.partitioner.IidPartitioner` (equal contiguous shares of
    the rows, like the paper's MNIST split; shuffle the rows first if they are sorted);
    ``dirichlet``: :class:`~flwr_datasets.partitioner.DirichletPartitioner` over the label
    (concentration ``alpha``; smaller is more heterogeneous).
    """
    _require_flwr_datasets()
    from datasets import Dataset
    if int(num_agents) < 1 or int(num_agents) > len(y):
        raise ValueError(f"num_agents={num_agents!r}; must be in [1, {len(y)}]")
    ds = Dataset.from_dict({"x": np.arange(len(y)), "label": np.asarray(y, dtype=np.int64)})
    part = _partitioner(kind, int(num_agents), alpha, seed)
    part.dataset = ds
    return [np.asarray(part.load_partition(p)["x"], dtype=np.int64) for p in range(int(num_agents))]


def split_arrays(X, y, num_agents: int, kind: str = "iid", alpha: float = 0.5, seed: int = 42):
    """(X_parts, y_parts) for every agent (see :func:`split_indices`)."""
    idx = split_indices(y, num_agents, kind, alpha, seed)
    return [X[i] for i in idx], [np.asarray(y)[i] for i in idx]


def agent_partition(X, y, partition_id: int, num_agents: int, kind: str = "iid", alpha: float = 0.5,
                    seed: int = 42):
    """One agent's own (X_p, y_p); what a ClientApp loads from its ``partition-id``."""
    if not 0 <= int(partition_id) < int(num_agents):
        raise ValueError(f"partition-id={partition_id!r}; must be in [0, {num_agents})")
    i = split_indices(y, num_agents, kind, alpha, seed)[int(partition_id)]
    return X[i], np.asarray(y)[i]


def fashion_mnist_split(num_agents: int = 10, kind: str = "iid", alpha: float = 0.5, seed: int = 42,
                        data_dir: str | None = None):
    """Fashion-MNIST (pixels in [0, 1]) split over agents, and the test set.

    Returns X_parts, y_parts, X_test, y_test. The training rows of Fashion-MNIST are not
    sorted by class, so the IID split is 10 x 6000 with about 600 rows of each class.
    """
    from flower_vfl.datasets import load_fashion_mnist
    X, y, Xt, yt = load_fashion_mnist(data_dir)
    Xp, yp = split_arrays(X, y, num_agents, kind, alpha, seed)
    return Xp, yp, Xt, yt
