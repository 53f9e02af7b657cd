"""What a party's node config declares as its data: the identity of its privacy budget.

A party's ledger (:class:`flower_vfl.privacy.ledger.Ledger`) is keyed by the data source its
own node config declares, never by the block the server shaped. The key is the same for
every row order, subset (PSI intersection), column split, ``num-parties``, preprocessing or
run the server chooses, so every release on any view of the same people composes in one
ledger (docs/privacy.md, "Trust model", "Unit of privacy").

Declared sources:

own files
    the node config's ``data-path`` (resolved to an absolute path) and the ID column that
    names its people (``id-column``, or the ``id-path`` sidecar of a LIBSVM export).
bundled
    one of the public datasets (:data:`flower_vfl.io.data.DATASETS`), only when the node
    config declares no file: the run config's ``dataset``, read from the node config's
    ``data-dir`` (a9a; breast_cancer ships with scikit-learn), for the node's
    ``partition-id``. Each dataset is its own ledger key. This is what Flower's simulation
    engine gives a node (node config ``partition-id`` and ``num-partitions`` only), so
    ``flwr run .`` on bundled data keeps working.

horizontal agents
    the Fashion-MNIST files in the node config's ``data-dir`` and the node's ``partition-id``
    (:func:`agent_source`). Which of those samples the agent trains on (``hz-num-agents``,
    ``hz-split``) is the run config's choice and is not part of the key: every split composes
    in the agent's one ledger.

Only the node config names a party's files, ID column, preprocessing, model and output
folders: a run config that tries to (:data:`PARTY_KEYS_IN_RUN_CONFIG`) is refused with an
error naming the key, and a party that declares nothing and has no bundled fallback (an
own-data run) refuses to start. Glue only: no Flower imports, no data read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from flower_vfl.config.schema import ConfigError

__all__ = ["DeclaredSource", "PARTY_KEYS_IN_RUN_CONFIG", "agent_source", "declared_source", "refuse_party_keys"]

#: run-config keys that would name a party's files, ID column, preprocessing or model folder,
#: with the value that means "not set" (pyproject's defaults put every key in a run config)
PARTY_KEYS_IN_RUN_CONFIG = {
    "party-data-paths": "", "party-test-paths": "", "party-score-paths": "", "party-model-dirs": "",
    "preprocess": "none", "id-column": "id",
}
#: of those, keys the label owner also reads from the run config for its own files: refused only
#: when the party's node config does not set the key itself (then the run config would decide it)
_SHARED_WITH_LABEL_OWNER = ("id-column", "preprocess")
_NODE_KEY = {"party-data-paths": "data-path", "party-test-paths": "test-path", "party-score-paths": "score-path",
             "party-model-dirs": "model-dir"}


@dataclass(frozen=True)
class DeclaredSource:
    """A party's declared data: ``kind`` ('files' or 'bundled'), ``about`` (what it is, in the
    canonical form the key is made of) and ``key`` (the ledger key)."""

    kind: str
    about: dict = field(hash=False)
    key: str = ""
    dataset: str | None = None        # bundled only
    data_dir: str | None = None       # bundled only: the node config's data-dir ('' = the default)


def _set(value, unset) -> bool:
    return value is not None and str(value).strip() != str(unset)


def refuse_party_keys(run_config, node_config, party) -> None:
    """Refuse a run config that names this party's files, ID column, preprocessing or model
    folder (:class:`ConfigError` naming the key and the node-config key to use instead)."""
    rc, nc = dict(run_config or {}), dict(node_config or {})
    for key, unset in PARTY_KEYS_IN_RUN_CONFIG.items():
        if not _set(rc.get(key), unset):
            continue
        if key in _SHARED_WITH_LABEL_OWNER and key in nc:
            continue                      # the run config's value is the label owner's; the party uses its own
        node_key = _NODE_KEY.get(key, key)
        raise ConfigError(
            f"party {party}: run config key {key!r}={rc[key]!r} is refused: only a party's own node config "
            f"names its files, ID column, preprocessing and model folder (the run config is written by the "
            f"server side). Set {node_key!r} in this party's --node-config instead"
            + (" (the label owner's own value may stay in the run config once the party declares its own)"
               if key in _SHARED_WITH_LABEL_OWNER else ""))


def _own_data_run(rc) -> str:
    """The run-config key that makes this an own-data run ('' when it is not)."""
    for key in ("labels-path", "score-ids-path"):
        if _set(rc.get(key), ""):
            return key
    return "mode" if str(rc.get("mode", "train")) == "predict" else ""


def _resolved(path) -> str:
    return str(Path(str(path)).expanduser().resolve())


def _source(kind, about, **kw) -> DeclaredSource:
    return DeclaredSource(kind, about, json.dumps(about, sort_keys=True, separators=(",", ":")), **kw)


def declared_source(node_config, run_config=None, party=None) -> DeclaredSource:
    """The data this party's node config declares, and its ledger key.

    Raises :class:`ConfigError` naming the key when the run config tries to name the party's
    files (:func:`refuse_party_keys`), or when the node config declares no data and the run
    has no bundled dataset to fall back on.
    """
    from flower_vfl.io.data import DATASETS, default_data_dir

    nc, rc = dict(node_config or {}), dict(run_config or {})
    party = nc.get("partition-id", party)
    refuse_party_keys(rc, nc, party)
    path = str(nc.get("data-path", "") or "").strip()
    if path:
        about = {"kind": "files", "data-path": _resolved(path)}
        id_path = str(nc.get("id-path", "") or "").strip()
        if id_path:
            about["id-path"] = _resolved(id_path)
        else:
            about["id-column"] = str(nc.get("id-column", "id") or "id")
        return _source("files", about)
    own = _own_data_run(rc)
    if own:
        raise ConfigError(f"party {party} declares no data: its node config has no 'data-path', and this run "
                          f"({own}={rc[own]!r}) is an own-data run, not one on a bundled dataset. Start the "
                          "SuperNode with --node-config \"partition-id=<m> data-path=<its file> id-column=<its "
                          "ID column>\" (docs/own-data.md)")
    dataset = str(rc.get("dataset", "breast_cancer"))
    if dataset not in DATASETS:
        raise ConfigError(f"party {party} declares no data (no 'data-path' in its node config) and run config "
                          f"dataset={dataset!r} is not a bundled dataset ({', '.join(DATASETS)}); declare the "
                          "party's file in its node config (data-path, id-column)")
    if party is None:
        raise ConfigError("node config key 'partition-id' is missing: a party on a bundled dataset is the "
                          "partition its node config names")
    data_dir = str(nc.get("data-dir", "") or "")
    location = "scikit-learn" if dataset == "breast_cancer" else \
        _resolved(data_dir or default_data_dir(dataset))
    about = {"kind": "bundled", "dataset": dataset, "location": location, "partition-id": int(party)}
    return _source("bundled", about, dataset=dataset, data_dir=data_dir)


def agent_source(node_config, default_dir) -> DeclaredSource:
    """The data a horizontal agent's node config declares (its ledger key): the Fashion-MNIST
    folder (``data-dir``, else ``default_dir``, where the app reads it from) and its
    ``partition-id``. Not the run config's ``hz-num-agents`` / ``hz-split``: a new split of
    the same samples is the same ledger."""
    nc = dict(node_config or {})
    if nc.get("partition-id") is None:
        raise ConfigError("node config key 'partition-id' is missing: an agent is the partition its node "
                          "config names, e.g. --node-config \"partition-id=0\"")
    data_dir = str(nc.get("data-dir", "") or "")
    about = {"kind": "bundled", "dataset": "fashion_mnist", "location": _resolved(data_dir or default_dir),
             "partition-id": int(nc["partition-id"])}
    return _source("bundled", about, dataset="fashion_mnist", data_dir=data_dir)


def party_node_config(context) -> dict:
    """The node config, over the party's own file named by ``FLOWER_VFL_NODE_CONFIG`` (a JSON
    object ``{"<partition-id>": {key: value}}``) when set: both live on the party's machine, so
    both are trusted; the simulation engine gives nodes no node config of their own, and this
    file is how ``flower-vfl simulate`` hands each simulated party its privacy settings."""
    nc = dict(context.node_config)
    path = os.environ.get("FLOWER_VFL_NODE_CONFIG")
    if path and "partition-id" in nc:
        with open(path) as fh:
            extra = json.load(fh).get(str(int(nc["partition-id"])), {})
        nc = {**extra, **nc}
    return nc
