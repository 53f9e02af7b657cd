"""The label owner's sample alignment, run as Flower query messages before training.

Two round trips per split (see :mod:`flower_vfl.io.psi` for the protocol and what each side
learns): ``query.psi_answer`` carries the label owner's encrypted request and brings back each
party's encrypted set; ``query.psi_order`` sends each party the agreed intersection in the
label owner's row order, and every party answers with the digest it aligned to. Glue only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.io import psi as psi
from flower_vfl.config.schema import ConfigError
from flower_vfl.strategies.replies import PartyFailed, PartyLost, ReplyError, claim

__all__ = ["PSIAlignment", "AlignResult"]


@dataclass
class AlignResult:
    """``order``: label-owner row indices of the agreed intersection, in its row order;
    ``node_to_party``: node id -> party; ``set_sizes``: what the label owner learned of |P_m|."""

    split: str
    order: np.ndarray
    node_to_party: dict
    set_sizes: dict = field(default_factory=dict)
    pairwise: dict = field(default_factory=dict)


class PSIAlignment:
    """Align the label owner's IDs of one split with every party's.

    Parameters
    ----------
    ids : sequence of str
        The label owner's IDs (its row order).
    num_parties : int
    split : {'train', 'test', 'score'}, default='train'
        Which of the parties' files (node-config data-path, test-path, score-path) to align.
    structure : {'raw', 'gcs', 'bloom'}, default='raw'
        How a party encodes its encrypted set: 'raw' is exact, 'gcs'/'bloom' are smaller and
        admit false positives at rate ``fpr`` (a false positive is caught in the order step).
    fpr : float, default=1e-9
    min_rows : int, default=2
    timeout : float, default=600
    """

    def __init__(self, ids, num_parties: int, split: str = "train", structure: str = "raw", fpr: float = 1e-9,
                 min_rows: int = 2, timeout: float = 600.0):
        self.ids = [str(v) for v in ids]
        self.num_parties, self.split = int(num_parties), split
        self.structure, self.fpr, self.min_rows, self.timeout = structure, float(fpr), int(min_rows), timeout

    def _exchange(self, grid: Grid, msgs: list[Message], what: str) -> dict:
        """Replies keyed by the node each request went to (matched by reply_to_message_id)."""
        by_id = {}
        replies = list(grid.send_and_receive(msgs, timeout=self.timeout))
        dst_by_mid = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs if m.metadata.message_id}
        for rep in replies:
            nid = dst_by_mid.get(rep.metadata.reply_to_message_id, rep.metadata.src_node_id)
            if rep.has_error():
                raise PartyFailed(f"node {nid} failed the PSI {what} step for split {self.split!r}: "
                                  f"{rep.error.reason}")
            by_id[nid] = rep.content["psi"]
        missing = sorted({m.metadata.dst_node_id for m in msgs} - set(by_id))
        if missing:
            raise PartyLost(f"nodes {missing} did not answer the PSI {what} step within {self.timeout} s")
        return by_id

    def run(self, grid: Grid) -> AlignResult:
        owner = psi.LabelOwnerPSI(self.ids)
        request = owner.request()
        nodes = list(grid.get_node_ids())
        cfg = {"split": self.split, "request": request, "fpr": self.fpr, "structure": self.structure}
        msgs = [Message(RecordDict({"psi": ConfigRecord(cfg)}), dst_node_id=nid,
                        message_type="query.psi_answer") for nid in nodes]
        answers = self._exchange(grid, msgs, "answer")
        node_to_party, pairwise, sizes, seen = {}, {}, {}, {}
        for nid, rec in sorted(answers.items()):
            m = int(rec["party"])
            claim(seen, "party", m, nid, ConfigError)
            node_to_party[nid] = m
            pairwise[m] = owner.intersect(bytes(rec["setup"]), bytes(rec["response"]), f"party {m} (node {nid})")
            sizes[m] = _setup_size(bytes(rec["setup"]))
        missing = sorted(set(range(self.num_parties)) - set(pairwise))
        if missing:
            raise PartyLost(f"parties {missing} did not take part in the PSI step (nodes seen: {sorted(nodes)}); "
                            f"start one SuperNode per party or set num-parties={len(pairwise)}")
        order = psi.agree_order(len(self.ids), pairwise, self.min_rows,
                                {"train": "training", "test": "held-out", "score": "scoring"}[self.split])
        agreed = [self.ids[i] for i in order]
        blob, digest = psi.encode_ids(agreed), psi.ids_digest(agreed)
        msgs = [Message(RecordDict({"psi": ConfigRecord({"split": self.split, "order": blob, "digest": digest})}),
                        dst_node_id=nid, message_type="query.psi_order") for nid in sorted(answers)]
        for nid, rec in self._exchange(grid, msgs, "order").items():
            if str(rec["digest"]) != digest or int(rec["n_rows"]) != len(agreed):
                raise ReplyError(f"party {node_to_party[nid]} (node {nid}) aligned {int(rec['n_rows'])} rows to a "
                                 f"different order than the {len(agreed)} agreed ones")
        log(INFO, "PSI %s: %d of the label owner's %d rows are common to all %d parties (pairwise %s)",
            self.split, len(agreed), len(self.ids), len(pairwise),
            {m: len(i) for m, i in sorted(pairwise.items())})
        return AlignResult(self.split, order, node_to_party, sizes, pairwise)


def _setup_size(setup: bytes) -> int:
    """|P_m| as the party's setup message states it (raw: the number of encrypted items)."""
    import private_set_intersection.python as ps
    s = ps.ServerSetup()
    s.ParseFromString(setup)
    if s.WhichOneof("data_structure") == "raw":
        return len(s.raw.encrypted_elements)
    return -1                                   # gcs / bloom: only an approximate size is exposed
