"""The label owner's sample alignment, run as Flower query messages before training.

Two round trips per split (see :mod:`flower_vfl.io.psi` for the protocol and what each side
learns): ``query.psi_answer`` carries the label owner's encrypted request and brings back each
party's encrypted set; ``query.psi_order`` sends each party the agreed intersection in the
label owner's row order, and every party answers with the digest it aligned to. Glue only; the
answer step identifies the parties (the index each node claims in its ``psi`` reply) through
:class:`~flower_vfl.strategies.exchange.Exchange`, as every central-node path does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.io import psi as psi
from flower_vfl.config.schema import ConfigError
from flower_vfl.strategies.exchange import Exchange, ReplyError

__all__ = ["PSIAlignment", "AlignResult"]


@dataclass
class AlignResult:
    """``order``: label-owner row indices of the agreed intersection, in its row order;
    ``node_to_party``: node id -> party; ``set_sizes``: what the label owner learned of |P_m|;
    ``exchange``: the channel the alignment identified the parties on (for the jobs that follow)."""

    split: str
    order: np.ndarray
    node_to_party: dict
    set_sizes: dict = field(default_factory=dict)
    pairwise: dict = field(default_factory=dict)
    exchange: Exchange | None = field(default=None, repr=False)


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
    party_wait : float, default=0
        Seconds to wait for every party to have a node (``party-wait``), as every identify step.
    party_keys : dict or None
        Party -> SHA-256 fingerprint of the SuperNode key allowed to serve it (``party-keys``).
    key_dir : str or None
        The label owner's folder for its kept PSI key (run config ``state-dir``; None: its default,
        :func:`flower_vfl.io.psi.label_owner_key`).
    """

    def __init__(self, ids, num_parties: int, split: str = "train", structure: str = "raw", fpr: float = 1e-9,
                 min_rows: int = 2, timeout: float = 600.0, party_wait: float = 0.0, party_keys=None,
                 key_dir=None):
        self.ids = [str(v) for v in ids]
        self.num_parties, self.split = int(num_parties), split
        self.structure, self.fpr, self.min_rows, self.timeout = structure, float(fpr), int(min_rows), timeout
        self.party_wait, self.party_keys, self.key_dir = float(party_wait), party_keys, key_dir

    @staticmethod
    def _read(nid, rep):
        """The party a node claims in its PSI answer, and the answer."""
        if "psi" not in rep.content.config_records or "party" not in rep.content.config_records["psi"]:
            raise ReplyError(f"node {nid} sent a PSI answer without its 'psi' record and party "
                             f"(records: {sorted(rep.content.keys())})")
        rec = rep.content.config_records["psi"]
        return int(rec["party"]), rec

    def run(self, grid: Grid) -> AlignResult:
        owner = psi.LabelOwnerPSI(self.ids, state_dir=self.key_dir)
        request = owner.request()
        ex = Exchange(grid, self.num_parties, timeout=self.timeout, party_wait=self.party_wait,
                      party_keys=self.party_keys, claim_error=ConfigError)
        cfg = {"split": self.split, "request": request, "fpr": self.fpr, "structure": self.structure}
        answers = ex.identify("query.psi_answer", RecordDict({"psi": ConfigRecord(cfg)}), self._read,
                              f"the PSI answer step for split {self.split!r}")
        node_of = ex.node_of()
        pairwise, sizes = {}, {}
        for m, rec in sorted(answers.items()):
            pairwise[m] = owner.intersect(bytes(rec["setup"]), bytes(rec["response"]), f"party {m} (node {node_of[m]})")
            sizes[m] = _setup_size(bytes(rec["setup"]))
        order = psi.agree_order(len(self.ids), pairwise, self.min_rows,
                                {"train": "training", "test": "held-out", "score": "scoring"}[self.split])
        agreed = [self.ids[i] for i in order]
        blob, digest = psi.encode_ids(agreed), psi.ids_digest(agreed)
        content = RecordDict({"psi": ConfigRecord({"split": self.split, "order": blob, "digest": digest})})
        what = f"PSI order (split {self.split!r})"
        for m, rep in ex.send(lambda p, nid: content, "query.psi_order", range(self.num_parties), what).items():
            rec = rep.content.config_records.get("psi")
            if rec is None or str(rec.get("digest")) != digest or int(rec.get("n_rows", -1)) != len(agreed):
                n = -1 if rec is None else int(rec.get("n_rows", -1))
                raise ReplyError(f"party {m} (node {ex.node_of()[m]}) aligned {n} rows to a different order "
                                 f"than the {len(agreed)} agreed ones")
        log(INFO, "PSI %s: %d of the label owner's %d rows are common to all %d parties (pairwise %s)",
            self.split, len(agreed), len(self.ids), len(pairwise),
            {m: len(i) for m, i in sorted(pairwise.items())})
        return AlignResult(self.split, order, dict(ex.node_to_party), sizes, pairwise, ex)


def _setup_size(setup: bytes) -> int:
    """|P_m| as the party's setup message states it (raw: the number of encrypted items)."""
    import private_set_intersection.python as ps
    s = ps.ServerSetup()
    s.ParseFromString(setup)
    if s.WhichOneof("data_structure") == "raw":
        return len(s.raw.encrypted_elements)
    return -1                                   # gcs / bloom: only an approximate size is exposed
