"""A party's own data in Flower: PSI alignment, its aligned blocks, its saved model, prediction.

Handler functions ``fn(msg, context) -> Message`` that a ClientApp registers as query
handlers (``client_app.py``):

* ``psi_answer``  (``query.psi_answer``): step 2 of :mod:`flower_vfl.io.psi` on the split's IDs;
* ``psi_order``   (``query.psi_order``): the agreed intersection; the row order is kept in
  ``context.state`` and every later message of the run uses it;
* ``save_model``  (``query.save_model``): x_m, preprocessing, columns, fingerprint to the
  party's own disk (nothing of the model goes back);
* ``predict``     (``query.predict``): D_m x_m on the aligned scoring rows from the saved model
  (a non-linear block model's f_m(D_m): its map or network rebuilt from the saved kind and settings);
  masked under secure aggregation (run config ``secagg=true``; docs/secagg.md), when the
  label owner learns only the sum of the parties' scores;
* ``secagg_keys`` (``query.secagg_keys`` of a party on its own files): this run's signed key
  advert, from the node config alone (the predict job aligns no training rows).

Glue only: reading is :mod:`flower_vfl.io`, the protocol :mod:`flower_vfl.io.psi`, the file
format :mod:`flower_vfl.io.model_files`.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.io import model_files as model_io
from flower_vfl.io import psi as psi
from flower_vfl.clients.source import party_node_config
from flower_vfl.config.schema import ConfigError
from flower_vfl.core.scoring import party_scores
from flower_vfl.io import DataError, Preprocessor, align_rows, read_party, source_from_config

__all__ = ["psi_answer", "psi_order", "save_model", "predict", "secagg_keys", "own_blocks", "party_source",
           "model_path", "uses_own_data", "history_seed", "bound_to_alignment"]

STATE_ALIGN = "vfl.align."
STATE_ALIGN_DIGEST = "vfl.align_digest."     # + split: the digest of the agreed order (psi_order)
#: the predict request's field naming the agreed scoring order (psi.ids_digest), under secagg
ORDER_DIGEST = "order-digest"
#: (source, its files' size, mtime, ctime, inode) -> PartyTable, while the process lives (ctime
#: changes with every write and every utime, so a file rewritten in place is read again)
_TABLES: OrderedDict = OrderedDict()


#: builds the party's client from its Context (set by flower_vfl.apps.client: make_client)
CLIENT_FACTORY = None


def node_cfg(context: Context) -> dict:
    """The party's data keys: its node config (over the party's own FLOWER_VFL_NODE_CONFIG file),
    and nothing else. The run config is the central node's: it never names this party's files,
    ID column, preprocessing or folders (docs/own-data.md, issue 20)."""
    return party_node_config(context)      # the node config + the party's own file


def uses_own_data(context: Context) -> bool:
    return bool(node_cfg(context).get("data-path"))


def _party_id(context: Context) -> int:
    return int(context.node_config.get("partition-id", 0))


def party_source(context: Context, split: str):
    import dataclasses
    label = str(context.run_config.get("label-column", "") or "")
    src = source_from_config(node_cfg(context), split, forbidden_label=label)
    return dataclasses.replace(src, label_optional=True) if split == "score" else src


def _table(context: Context, split: str):
    src = party_source(context, split)
    if not Path(src.path).is_file():
        return read_party(src)                       # raises the DataError naming the file
    from flower_vfl.io.party_cache import files_of
    stats = tuple((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                  for st in (os.stat(f) for f in files_of(src) if f.is_file()))
    key = (src, stats)
    if key not in _TABLES:
        _TABLES[key] = read_party(src)
        while len(_TABLES) > 6:
            _TABLES.popitem(last=False)
    return _TABLES[key]


def _aligned_idx(context: Context, split: str, table) -> np.ndarray:
    rec = context.state.get(STATE_ALIGN + split) if hasattr(context.state, "get") else None
    if rec is None:
        raise DataError(f"party {_party_id(context)}: the rows of {getattr(table, 'path', table)} are not aligned "
                        f"for split {split!r}; the run must start with the PSI step (the label owner's run config "
                        "names its labels-path, or score-ids-path for mode=predict)")
    return rec["idx"].numpy().astype(np.int64)


def _order_digest(context: Context, split: str) -> str:
    rec = context.state.get(STATE_ALIGN_DIGEST + split) if hasattr(context.state, "get") else None
    return "" if rec is None else str(rec.get("digest", ""))


def history_seed(context: Context) -> str:
    """The secure-aggregation history of a fresh state (hex; "" when there is none): on own data, the
    training row order the party agreed to (the same for every party of an honest run; a party shown
    another order than the others has another block, so it must not enter their sums:
    :func:`flower_vfl.clients.party_secagg.history_digest`)."""
    import hashlib
    if STATE_ALIGN_DIGEST + "train" not in context.state:
        return ""
    return hashlib.sha256(f"train={_order_digest(context, 'train')}".encode()).hexdigest()


def bound_to_alignment(context: Context, history: str | None, kind: str) -> str | None:
    """What a party's masked answer is bound to (hex), from its ``history`` (a non-private party's history
    of broadcasts; None for a private party) and the row orders its block is built on *now* (own data; a
    party without a training alignment: ``history`` unchanged). A history's seed holds the training order
    of a fresh state only, and a private party has none; a central node that re-aligns one party mid-run
    (or resumes it from a token after showing it another order) changes that party's rows under the same
    masks, and two sums over the one roster, one with its order rotated, differenced to that party's
    values minus their rotation (its exact release, or a private party's held-out scores, up to one
    constant). Bound to the current orders (the held-out order too for an evaluation), such a party's
    masks no longer cancel with the others'."""
    import hashlib
    if STATE_ALIGN_DIGEST + "train" not in context.state:
        return history
    splits = ("train", "test") if str(kind).startswith("evaluate") else ("train",)
    tag = "|".join(f"{s}={_order_digest(context, s)}" for s in splits)
    return hashlib.sha256(f"flower-vfl/secagg/alignment|{tag}|{history or ''}".encode()).hexdigest()


def _fresh_own_blocks(context: Context, idx, split_test, jdx):
    """Parse, align and preprocess the party's files (what the block cache keeps)."""
    tr = _table(context, "train")
    cat = {c: v[idx] for c, v in tr.categorical.items()}
    pre = Preprocessor(str(party_source(context, "train").preprocess))
    D = pre.fit_transform(tr.X[idx], tr.columns, cat)
    D_test = None
    if split_test:
        te = _table(context, "test")
        D_test = pre.transform(te.X[jdx], {c: v[jdx] for c, v in te.categorical.items()})
    return D, D_test, {"preprocessing": np.array(json.dumps(pre.to_dict())), "ids": tr.ids[idx]}


def refuse_fitted_preprocessing(context: Context) -> None:
    """A private party's preprocessing must be row-local. Every private release's sensitivity (the ADMM
    x-update's, SSP's, the label moment's) is derived for one row of D replaced, every other row the
    same; 'standardize' and 'maxabs' scale each column by statistics fitted on the aligned training rows
    (a subset the server picks), so one person changes every row: on a column constant but for that
    person, D^T v moves by O(c_v sqrt(N)), far past 2 c_v (tests/test_attacks_review6.py)."""
    kind = party_source(context, "train").preprocess
    if kind != "none":
        raise ConfigError(f"party {_party_id(context)} is private and its node config's preprocess={kind!r} scales "
                          "each column by statistics fitted on its aligned training rows, so one person changes "
                          "every row and no release would be within its calibrated sensitivity; refused before any "
                          "release. Set preprocess='none' in its node config (rows are scaled to unit norm anyway), "
                          "or scale the file's columns by fixed constants that are not computed from its rows")


def own_blocks(context: Context):
    """(D, D_test, preprocessor, ids): the party's aligned training (and held-out) rows,
    preprocessed with statistics fitted on its aligned training rows.

    Through the party's block cache (:func:`flower_vfl.io.party_cache.cached_own_block`, in its
    ``state-dir``): on a real SuperNode every message is a fresh process, and parsing, aligning and
    preprocessing the files again cost most of an own-data round (docs/benchmarks.md, "Own-data
    rounds on real nodes"). The key is what this party's node config declares (file, ID column,
    columns, preprocessing), its files' content, and the row order it agreed to at the PSI step."""
    from flower_vfl.io.party_cache import cached_own_block, own_block_key, verified_files
    src = party_source(context, "train")
    idx = _aligned_idx(context, "train", src.path)
    test = bool(node_cfg(context).get("test-path")) and (STATE_ALIGN + "test") in context.state
    parts = [("train", src, idx, _order_digest(context, "train"))]
    jdx = None
    if test:
        tsrc = party_source(context, "test")
        jdx = _aligned_idx(context, "test", tsrc.path)
        parts.append(("test", tsrc, jdx, _order_digest(context, "test")))
    state_dir = node_cfg(context).get("state-dir") or None
    verified = verified_files(state_dir)           # verified.json: read once for the key and the block
    key = own_block_key(parts, code_files=(__file__,), state_dir=state_dir, memo=True, verified=verified)
    D, D_test, extra = cached_own_block(key, src.path, src.id_column,
                                        lambda: _fresh_own_blocks(context, idx, test, jdx), state_dir,
                                        verified=verified)
    pre = Preprocessor.from_dict(json.loads(str(extra["preprocessing"])))
    return D, D_test, pre, extra["ids"]


# ------------------------------------------------------------------------ PSI handlers
def _psi_fields(msg: Message, context: Context, want: dict) -> dict:
    """The ``psi`` record's fields, typed and range-checked before anything is read or counted
    (the central node may send anything): ``want`` maps a field to 'split', 'bytes', 'str',
    'fpr' or 'structure'. A bad field is refused naming it (a bare ``bytes(n)`` of an integer
    would allocate n bytes, for one)."""
    import math
    import numbers
    from flower_vfl.io.sources import SPLITS
    from flower_vfl.privacy.boundary import InvalidMessage
    who = f"party {_party_id(context)}"
    if "psi" not in msg.content:
        raise InvalidMessage(f"{who}: message record 'psi' is missing", field="psi")
    cfg, out = msg.content["psi"], {}
    defaults = {"fpr": 1e-9, "structure": "raw"}
    for key, kind in want.items():
        if key not in cfg and key not in defaults:
            raise InvalidMessage(f"{who}: message field psi[{key!r}] is missing", field=f"psi.{key}")
        v = cfg[key] if key in cfg else defaults[key]
        ok = {"split": lambda: isinstance(v, str) and v in SPLITS,
              "bytes": lambda: isinstance(v, bytes),
              "str": lambda: isinstance(v, str) and len(v) <= 1024,
              "fpr": lambda: isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
              and 0.0 < v < 1.0,
              "structure": lambda: isinstance(v, str) and v in psi.DATA_STRUCTURES}[kind]()
        if not ok:
            allowed = {"split": f"one of {tuple(SPLITS)}", "bytes": "bytes", "str": "a string (<= 1024 chars)",
                       "fpr": "a number in (0, 1)", "structure": f"one of {psi.DATA_STRUCTURES}"}[kind]
            raise InvalidMessage(f"{who}: message field psi[{key!r}]={v!r:.60} is refused; expected {allowed}",
                                 field=f"psi.{key}")
        out[key] = v
    return out


def _psi_record(context: Context, split: str, table, kind: str, items, held=None) -> None:
    """Count ``items`` in the party's PSI log for this split's file, or refuse past its cap
    (``psi-max-asked`` × its own number of IDs, one cap for requests and orders, across all runs:
    :mod:`flower_vfl.io.psi_log`); ``held``: an order's per-ID flags (held by this party)."""
    from flower_vfl.io.psi_log import PsiLog, source_key
    from flower_vfl.privacy.store import default_state_dir
    nc = node_cfg(context)
    factor = nc.get("psi-max-asked", 1.0)
    try:
        factor = float(1.0 if factor in (None, "") else factor)
    except (TypeError, ValueError):
        factor = float("nan")
    if not (factor > 0 and np.isfinite(factor)):
        raise ConfigError(f"the node-config key psi-max-asked={nc.get('psi-max-asked')!r} must be a number > 0 "
                          "(a multiple of this party's own number of IDs; default 1.0)")
    src = party_source(context, split)
    log = PsiLog(nc.get("state-dir") or default_state_dir())
    try:
        log.record(source_key(src.path, src.id_column), kind, items, table.n_rows, factor,
                   run=getattr(context, "run_id", None), split=split, held=held)
    finally:
        log.close()


def psi_answer(msg: Message, context: Context) -> Message:
    """Step 2 of the ECDH-PSI: (setup, response) for the label owner's request, once the
    request's blinded items are counted in the party's PSI log (refused past its cap)."""
    cfg = _psi_fields(msg, context, {"split": "split", "request": "bytes", "fpr": "fpr", "structure": "structure"})
    split = cfg["split"]
    table = _table(context, split)
    request = cfg["request"]
    max_request = int(node_cfg(context).get("psi-max-request", 0) or 0)
    items = psi.request_items(request)
    if not (max_request and len(items) > max_request):       # else party_answer names that cap
        _psi_record(context, split, table, "request", items)
    setup, response = psi.party_answer(table.ids, request, float(cfg["fpr"]), cfg["structure"], max_request)
    return Message(RecordDict({"psi": ConfigRecord({"party": _party_id(context), "split": split,
                                                    "setup": setup, "response": response})}), reply_to=msg)


def _items(ids) -> list[str]:
    return [str(v) for v in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]


def psi_order(msg: Message, context: Context) -> Message:
    """The agreed intersection (label owner's order): keep the matching row indices."""
    cfg = _psi_fields(msg, context, {"split": "split", "order": "bytes", "digest": "str"})
    split = cfg["split"]
    try:
        order = psi.decode_ids(cfg["order"])
    except (UnicodeDecodeError, ValueError):
        order = None
    if not isinstance(order, list) or not all(isinstance(i, str) for i in order):
        raise DataError(f"party {_party_id(context)}: the agreed {split} order does not decode to a list of IDs")
    if psi.ids_digest(order) != cfg["digest"]:
        raise DataError(f"party {_party_id(context)}: the agreed {split} order arrived corrupted (digest mismatch)")
    if len(set(order)) != len(order):
        raise DataError(f"party {_party_id(context)}: the agreed {split} order names {len(order) - len(set(order))} "
                        "ID(s) more than once; each sample is one row")
    table = _table(context, split)
    # refusing an order tells the requester that some ID in it is not held: those IDs are membership
    # tests, counted with the requests' items against the one cap (io/psi_log.py)
    own = set(_items(table.ids))
    _psi_record(context, split, table, "order", order, held=[i in own for i in order])
    idx = align_rows(table.ids, order, where=f"party {_party_id(context)} ({table.path})")
    context.state[STATE_ALIGN + split] = ArrayRecord({"idx": Array(idx)})
    context.state[STATE_ALIGN_DIGEST + split] = ConfigRecord({"digest": cfg["digest"]})
    return Message(RecordDict({"psi": ConfigRecord({"party": _party_id(context), "split": split,
                                                    "n_rows": int(idx.size), "digest": psi.ids_digest(order)})}),
                   reply_to=msg)


# ------------------------------------------------------------------------ model handlers
def model_path(context: Context, party: int | None = None) -> Path:
    nc = node_cfg(context)
    base = nc.get("model-dir") or str(Path(str(nc.get("data-path", "."))).parent / "vfl-model")
    return Path(str(base)) / f"party-{_party_id(context) if party is None else party}.npz"


def save_model(msg: Message, context: Context) -> Message:
    """Write x_m (for a private party only its released x̃), preprocessing, columns and a
    fingerprint of the aligned training rows to the party's own disk; reply with an ack."""
    if CLIENT_FACTORY is None:
        raise RuntimeError("psi_party.CLIENT_FACTORY is not set: import flower_vfl.apps.client (it sets it)")
    D, _, pre, ids = own_blocks(context)
    client = CLIENT_FACTORY(context)
    private = client.privacy is not None
    model = getattr(client, "party_model", None)     # a non-linear block model (apps/client.py), else None
    party = client._build(context, int(client._meta(context)["n_outputs"] or 1) if model is not None else 1)
    if private:
        x = party.x_released          # the only model block a private party ever shows
        if x is None:
            raise ConfigError(f"party {_party_id(context)} is private and has not released its model x̃ "
                               "(the release happens in the final evaluation): give the run held-out rows "
                               "(labels-test-path and each party's test-path)")
    else:
        if getattr(party, "rho_x", None) is None and (getattr(client, "block", None) is not None or
                                                      not np.any(party.x)):
            raise ConfigError(f"party {_party_id(context)} has no trained block to save (no training round ran): "
                              "set max-rounds >= 1")
        x = party.x
    path = model_path(context)
    # a non-private model trained under secure aggregation: the history of broadcasts it comes from, which
    # the predict job's masks are bound to (party_secagg.history_digest): no predict sum mixes models of
    # two histories (one party's model re-saved from another run would be its exact scores)
    history = "" if private else str(client._meta(context).get("chain", ""))
    model_io.save_party_model(path, _party_id(context), x, pre.feature_names_, pre.to_dict(),
                              model_io.data_fingerprint(D, ids), D.shape[0], private=private,
                              extra={"run": dict(msg.content["config"]) if "config" in msg.content else {},
                                     **({"secagg_history": history} if history else {})},
                              block=None if model is None else model.to_meta())   # kind and settings, no rows
    return Message(RecordDict({"saved": ConfigRecord({"party": _party_id(context), "version": model_io.VERSION})}),
                   reply_to=msg)


def _secagg(context: Context, private: bool):
    from flower_vfl.clients.party_secagg import PartySecAgg
    return PartySecAgg(_party_id(context), node_cfg(context), private)


def secagg_keys(msg: Message, context: Context) -> Message:
    """This run's signed key advert (query.secagg_keys) from the node config alone: the same
    advert as :meth:`~flower_vfl.clients.party_base.PartyClient.secagg_keys` (the advert holds no
    data), for a party whose run aligned no training rows (the predict job)."""
    sa = _secagg(context, private=False)         # private only sets how a release is encoded
    return Message(RecordDict({"secagg": ConfigRecord({"party": _party_id(context), "advert": sa.advert(context)})}),
                   reply_to=msg)


def predict(msg: Message, context: Context) -> Message:
    """D_m x_m on the aligned scoring rows, from the model saved on this party's disk.

    Under secure aggregation (the request carries the relayed roster, ``secagg.adverts``): the
    reply is the scores masked against the SHA-256 of the request (round 0, kind ``predict``);
    the request must name the scoring order this party aligned to (``order-digest``), so a
    central node that showed parties different orders gets no sum. One masked answer per run:
    the same request again gets the stored bytes, another request is refused
    (:meth:`~flower_vfl.clients.party_secagg.PartySecAgg.masked_answer`). With the node config's
    ``secagg-only``, a plain request is refused."""
    from flower_vfl.clients.party_secagg import secagg_fields
    from flower_vfl.privacy.boundary import Refused
    path = model_path(context)
    m = model_io.load_model(path)
    meta = m["meta"]
    if meta["kind"] != "party" or int(meta["party"]) != _party_id(context):
        raise model_io.ModelFileError(f"{path} is not party {_party_id(context)}'s model (it is "
                                      f"{meta['kind']} {meta.get('party')}); fix the node-config key model-dir")
    sa = _secagg(context, private=bool(meta.get("private")))
    masked = secagg_fields(msg.content) is not None
    if not masked and sa.only:
        raise Refused(f"party {_party_id(context)} releases only under secure aggregation (node config "
                      "secagg-only); this predict request asks for plain scores: refused (set secagg=true in the "
                      "run config)", field="config.secagg.adverts")
    if not masked:
        sa.check_plain()            # answered a secure sum before: no plain release (a roster of one)
    table = _table(context, "score")
    idx = _aligned_idx(context, "score", table)

    def scores():
        pre = Preprocessor.from_dict(meta["preprocessing"])
        missing = [c for c in pre.columns_ if c not in table.columns]
        if missing:
            raise DataError(f"party {_party_id(context)}: the scoring file {table.path} lacks the model's column(s) "
                            f"{missing[:5]}; export the same columns as for training (or fix the key columns)")
        cols = [table.columns.index(c) for c in pre.columns_]        # the model's column order, by name
        D = pre.transform(table.X[idx][:, cols], {c: v[idx] for c, v in table.categorical.items()})
        if "block" in meta:      # a non-linear block: rebuilt from its kind and settings, new rows mapped the same way
            from flower_vfl.core.blocks import block_from_meta
            block = block_from_meta(meta["block"])
            if getattr(block, "nonlinear", False):
                return block.predict(D, m["x"])           # the network's forward pass (the engine's predict)
            D = block.features(D)
        # the evaluate handler's code (flower_vfl.core.scoring); a private party's x̃ is post-processed, free
        return party_scores(D, m["x"], private=bool(meta.get("private")))

    if masked:
        cfg = msg.content["config"]
        own = context.state[STATE_ALIGN_DIGEST + "score"]["digest"] if STATE_ALIGN_DIGEST + "score" in \
            context.state else None
        if cfg.get(ORDER_DIGEST) != own:
            raise Refused(f"party {_party_id(context)}: the predict request's config[{ORDER_DIGEST!r}]="
                          f"{str(cfg.get(ORDER_DIGEST))[:16]!r} is not the scoring order this party aligned to "
                          f"({str(own)[:16]!r}); refused (a secure sum needs every party's scores on the same rows)",
                          field=f"config.{ORDER_DIGEST}")
        s = sa.masked_answer(msg.content, context, "predict", 0, scores,
                             history=None if meta.get("private") else str(meta.get("secagg_history", "")))
    else:
        s = scores()
        sa.claim_plain()            # a plain release is a sum over this party alone (pinned keys: recorded)
    return Message(RecordDict({"release": ArrayRecord({"s_score": Array(s)}),
                               "meta": ConfigRecord({"party": _party_id(context)})}), reply_to=msg)
