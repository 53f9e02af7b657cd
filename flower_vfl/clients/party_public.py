"""A non-private vertical party: exact releases, its iterate in the run's ``context.state``.

The shared boundary and reply are :class:`~flower_vfl.clients.party_base.PartyClient`'s; here:
the x-update object (its factorization cached across messages of one process), the release
s_m = D_m x_m, the party's own cap on answers per run (node config ``max-answers``), and
replays (an identical re-send gets the same vector; an older round is refused). Glue only.

Where its state lives: small arrays (x, rho_x, CG's rate, a small factorization) in the run's
``context.state``; an array above :data:`STATE_DISK_MIN_BYTES` (z_loc of an over-relaxed run
at large N, the Gram's eigendecomposition at d > ~720) in the party's own state folder (node
config ``state-dir``, :mod:`flower_vfl.io.party_arrays`), with only its SHA-256 in
``context.state``: Flower may drop a large context at the end of the message. A deployed
SuperNode without ``state-dir`` refuses to keep such an array anywhere else
(:class:`~flower_vfl.privacy.store.StateDirRequired`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from flower_vfl.clients.party_base import PartyClient
from flower_vfl.core.constraints import make_constraint
from flower_vfl.core.party import PLAIN_ROUNDS, PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.core.scoring import released_scores
from flower_vfl.io import party_arrays
from flower_vfl.privacy.boundary import InvalidMessage, Refused, inputs_hash, parse_flag
from flower_vfl.privacy.store import StateDirRequired

__all__ = ["PublicPartyClient"]

STATE_ARRAYS = "vfl.party"
#: the last release, as kept before the lean state (read if present; no longer written)
STATE_LAST = "vfl.last"
#: CG's carried D x (the release, to round-off: not bitwise D @ x) is kept in context.state up to
#: this many bytes; a larger one is recomputed from x at the next message (one product). Every
#: other N-vector of the party's state is left out of context.state (see :meth:`PublicPartyClient._after_train`)
STATE_VECTOR_MAX_BYTES = 4 << 20
#: any other array of the state (and the factorization) above this many bytes is kept in the
#: party's state folder instead of context.state (:data:`STATE_DISK`, :data:`STATE_FACTOR`)
STATE_DISK_MIN_BYTES = STATE_VECTOR_MAX_BYTES
#: the x-update's rho-free factorization (core/xsolve.py: the Gram's eigendecomposition) kept in
#: the party's own context.state with a hash of the solver cache's key: on real SuperNodes every
#: message is a fresh process, which otherwise re-factorizes (0.18 s of a 0.31 s a9a training
#: handler, docs/benchmarks.md). Node-local; never sent to the central node. Above
#: STATE_DISK_MIN_BYTES the record holds the key and the SHA-256 (``sha``, 32 bytes) of its file
#: in ``<state-dir>/party-arrays/shared/`` instead (named by the key, so a later run of the same
#: block and parameters finds it); a missing or altered file is recomputed: it is only a cache.
STATE_FACTOR = "vfl.factor"
#: {array name: SHA-256 hex} of this run's arrays kept in ``<state-dir>/party-arrays/run-<run>/``
#: instead of STATE_ARRAYS (each above STATE_DISK_MIN_BYTES)
STATE_DISK = "vfl.party.disk"
#: the factorization files this process wrote or checked: key hex -> SHA-256 hex (not re-hashed
#: for every message of a simulation actor)
_FACTOR_FILES: dict = {}

#: x-update solvers (they hold the factorization of lam I + rho D^T D) kept across messages
#: while the process lives, keyed by a hash of the block and the solver parameters (and the
#: plain-rounds hint, which may change the method: :meth:`PartyUpdate.plain_rounds`). What a
#: solver carries from one solve to the next (CG's measured rate) is the party's state, set from
#: context.state on every message (reset when a run starts), never the cache's. A
#: simulation actor or an in-process grid serves many messages from one process: without
#: this cache every message re-factorized (about 60% of a non-private a9a party's handler
#: time, benchmarks/bench_flower.py). On real SuperNodes each message is a fresh process
#: and the cache is simply empty.
_SOLVERS: OrderedDict = OrderedDict()
_SOLVERS_MAX = 8


def _fingerprint(D) -> tuple:
    """Type, shape and a SHA-256 of the block's content: the solver cache's key (never the
    privacy ledger's: that is the declared source, flower_vfl.clients.source). A block the
    party's block cache returned carries that SHA-256 already (the cache file's checksum over the
    block's arrays, :func:`flower_vfl.io.party_cache.block_digest`): no pass over it here."""
    from flower_vfl.io.party_cache import block_digest
    known = block_digest(D)
    if known is not None:
        return type(D).__name__, tuple(D.shape), "block-cache:" + known
    h = hashlib.sha256()
    M = D.tocsr() if sp.issparse(D) else None
    parts = (M.indptr, M.indices, M.data) if M is not None else (np.asarray(D),)
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}|{a.shape}|".encode())
        h.update(memoryview(a).cast("B"))
    return type(D).__name__, tuple(D.shape), h.hexdigest()


class PublicPartyClient(PartyClient):
    """A party that releases exact values (``privacy=None``); parameters as
    :class:`~flower_vfl.clients.party_base.PartyClient`."""

    private = False
    #: the party's network block (core/blocks_mlp.py's MLPBlock, set by apps/client.py's make_client);
    #: None: the linear block's x-update on the (possibly feature-mapped) rows
    block = None

    def _plain_rounds(self, cfg):
        """A bool or refused, naming the key (absent: False, the accelerated rounds' x-update)."""
        return parse_flag(cfg, PLAIN_ROUNDS, self.party_id)

    def _build(self, context: Context, n_outputs: int, plain: bool = False):
        if self.block is not None:           # a network block (core/blocks_mlp.py): the engine's update
            return self._build_network(context, n_outputs, plain)
        # centred x-update (core/xsolve.py) when the label owner fits the intercept that absorbs
        # the constants; a wrong flag only slows or biases the central node's own model
        center = bool(context.run_config.get("fit-intercept", True))
        party = PartyUpdate(self.D, get_penalty(self.penalty, self.l1_ratio), self.lam,
                            make_constraint(self.constraint), n_outputs=n_outputs, x_solver=self.x_solver,
                            center=center)
        self._plain = bool(plain)
        if self._plain:                # as the engine does (estimator/engine.py), before any solve
            party.plain_rounds()
        key = (_fingerprint(self.D), str(self.penalty), float(self.l1_ratio), float(self.lam), repr(self.constraint),
               str(self.x_solver), center, self._plain)
        self._factor_key = np.frombuffer(hashlib.sha256(repr(key).encode()).digest(), dtype=np.uint8).copy()
        if key in _SOLVERS:
            party.solver = _SOLVERS[key]       # same block and parameters: reuse its factorization
            _SOLVERS.move_to_end(key)
        else:
            _SOLVERS[key] = party.solver
            while len(_SOLVERS) > _SOLVERS_MAX:
                _SOLVERS.popitem(last=False)
            self._adopt_factor(context, party)
        # this run's state (none yet: a run's start, which also resets what a cached solver carried)
        rec = context.state[STATE_ARRAYS] if STATE_ARRAYS in context.state else {}
        state = {k: rec[k].numpy() for k in rec}
        self._lost = self._disk_state(context, state)
        self._kept, self._alpha = set(state), None      # _alpha: this train request's, once read
        if "x" in state and "s" not in state:
            # the lean state (_after_train): the last release is CG's carried D x when kept, else
            # D @ x of the kept x, the product that made it (every path but CG: bitwise the same)
            state["s"] = state["Dx"] if "Dx" in state else self.D @ state["x"]
        party.set_state(state)
        return party

    def _build_network(self, context: Context, n_outputs: int, plain: bool):
        """The MLP block's x-update (the very object the in-process engine steps), restored from this
        run's state: its parameters, Adam's moments and round counter from context.state or, when
        large, the state folder (:meth:`_after_train`); no factorization to cache."""
        party = self.block.make_update(self.D, self.lam, n_outputs)
        self._plain, self._factor_key = bool(plain), None
        rec = context.state[STATE_ARRAYS] if STATE_ARRAYS in context.state else {}
        state = {k: rec[k].numpy() for k in rec}
        self._lost = self._disk_state(context, state)
        self._kept, self._alpha = set(state), None
        party.set_state(state)              # s, when left out: the network's forward pass (bitwise)
        return party

    # ------------------------------------------------------------ the party's state folder
    def _folder(self, what: str):
        """``<state-dir>/party-arrays`` (StateDirRequired, naming ``what``, on a deployed node without one)."""
        return party_arrays.arrays_folder(self.state_dir, what)

    def _factor_stem(self) -> str:
        return f"factor-{bytes(self._factor_key).hex()}"

    def _adopt_factor(self, context: Context, party):
        """A fresh process's solver takes the factorization this node computed before: from
        context.state (small), or from its file in the state folder, checked against the SHA-256
        that context.state holds (or, in a new run, against the digest in the file's name).
        Missing or altered: nothing adopted, the solver factorizes (bitwise the same)."""
        rec = context.state[STATE_FACTOR] if STATE_FACTOR in context.state else None
        ours = rec is not None and "key" in rec and np.array_equal(rec["key"].numpy(), self._factor_key)
        if ours and "sha" not in rec:        # kept in context.state
            party.solver.adopt_factorization({k: rec[k].numpy() for k in rec if k != "key"})
            return
        try:
            folder = self._folder("the x-update's factorization") / "shared"
        except StateDirRequired:
            return                            # nothing kept on disk without a state folder
        if ours:
            sha = bytes(rec["sha"].numpy()).hex()
            got = party_arrays.read_arrays(folder, self._factor_stem(), sha)
        else:                                 # a new run (or a lost state): a file of this key
            found = party_arrays.find_arrays(folder, self._factor_stem())
            sha, got = found if found is not None else (None, None)
        if got is not None and party.solver.adopt_factorization(got):
            _FACTOR_FILES[self._factor_stem()] = sha

    def _disk_state(self, context: Context, state: dict) -> set:
        """Load this run's arrays kept in the state folder into ``state`` (each checked against its
        SHA-256 in context.state); returns the names whose file is missing or altered. z_loc is
        then simply not kept (a relaxed round is refused, :meth:`_train_release`); anything else
        (x) refuses the message: the party never goes on from a state it does not have."""
        rec = dict(context.state[STATE_DISK]) if STATE_DISK in context.state else {}
        if not rec:
            return set()
        try:
            folder = party_arrays.run_folder(self._folder("this run's state"), context.run_id)
        except StateDirRequired:
            folder = None
        lost = set()
        for name, sha in rec.items():
            got = None if folder is None else party_arrays.read_arrays(folder, f"party{self.party_id}-{name}", str(sha))
            if got is None:
                lost.add(name)
            else:
                state[name] = got["a"]
        if lost - {"z_loc"}:
            raise Refused(f"party {self.party_id}: its state array(s) {sorted(lost - {'z_loc'})} of run "
                          f"{context.run_id}, kept in its state folder ({folder}), are missing or do not match the "
                          "SHA-256 kept in context.state; refused (this party does not go on from a state it "
                          "no longer has)")
        return lost

    def _identity(self, context: Context) -> dict:
        # the round this party's state in this run has reached (-1: none), for resume
        return {"last_train": int(self._meta(context)["last_train"])}

    def _train_release(self, inputs, meta, context):
        """Rounds must increase, an identical re-send gets the same vector, and the party's own
        cap on answers per run (node config max-answers) holds."""
        h = inputs_hash(context.run_id, "train", inputs)
        self._alpha = float(inputs.alpha)
        if inputs.round == meta["last_train"] and h == meta["last_hash"]:
            if STATE_LAST in context.state:
                return context.state[STATE_LAST]["s"].numpy()
            if "x" in self._kept:          # the release of that round, restored by _build
                return np.array(self.party.s, dtype=float)
        if inputs.round <= meta["last_train"]:
            raise Refused(f"party {self.party_id}: train round {inputs.round} is not after the last answered "
                          f"round {meta['last_train']}; round numbers must increase", field="config.round")
        if self.max_answers and meta["answers"] >= self.max_answers:
            raise Refused(f"party {self.party_id} has given the {self.max_answers} answers its node config "
                          "allows per run (max-answers); refused", field="config.round")
        if self._alpha != 1.0 and meta["last_train"] >= 0 and "z_loc" in self._lost:
            raise Refused(f"party {self.party_id}: train round {inputs.round} asks for over-relaxation "
                          f"(alpha={self._alpha!r}), and its share of z from the round before, kept in its state "
                          "folder, is missing or does not match the SHA-256 kept in context.state; refused (the "
                          "relaxed x-update needs it; a round with alpha=1 does not)", field="config.alpha")
        if self._alpha != 1.0 and meta["last_train"] >= 0 and "x" in self._kept and "z_loc" not in self._kept:
            raise Refused(f"party {self.party_id}: train round {inputs.round} asks for over-relaxation "
                          f"(alpha={self._alpha!r}) but the round before it did not (alpha=1), so this party "
                          "did not keep its share of z that the relaxed x-update needs; refused (keep one "
                          "alpha for the whole run)", field="config.alpha")
        s = self.party.train_release(inputs.round, inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta,
                                     v=inputs.v, q_norm=inputs.q_norm)
        if not np.all(np.isfinite(s)):      # refused before context.state is written: nothing changes
            raise InvalidMessage(f"party {self.party_id}: the train release at rho={inputs.rho!r} is not finite; "
                                 "refused (the party's node config can narrow the accepted rho with min-rho / "
                                 "max-rho)", field="config.rho")
        meta.update(last_train=inputs.round, answers=meta["answers"] + 1, last_hash=h, plain_rounds=self._plain)
        if STATE_LAST in context.state:
            del context.state[STATE_LAST]
        return s

    def _after_train(self, context):
        """Keep the party's state for the next message of this run, without the N-vectors it can
        rebuild: on a real SuperNode context.state travels whole to and from every message's
        ClientApp, and Flower's ClientApp pushes it back in its exit handler, which Flower ends
        (``os._exit``) 5 s after it began (``flwr_exit``'s FORCE_EXIT_TIMEOUT_SECONDS). With the
        release s, z_loc and the last release kept (3 N-vectors, 0.24 GB at 10M rows; CG's D x a
        4th) that push did not finish: the node never got the context (the next message
        restarted from an empty state) nor the task's end (its token expired a minute later and
        the node answered the message then in flight with Flower's "ClientApp stopped
        responding").
        Left out: s (D @ x, or CG's carried D x: :meth:`_build` restores it, and an identical
        re-send returns it), z_loc when this round was not over-relaxed (alpha = 1: the next
        x-update does not read it; a later round that asks for alpha != 1 is refused), and CG's
        carried D x and D^T D x when either is above :data:`STATE_VECTOR_MAX_BYTES` (the next solve
        forms D x from x). Kept in the state folder instead of context.state: any other array
        above :data:`STATE_DISK_MIN_BYTES` (z_loc of a relaxed round at large N; x of a very wide
        block) and a large factorization (:meth:`_factor_record`); context.state then holds their
        SHA-256s."""
        state = self.party.get_state()
        drop = {"s"}
        # (no request read: a stored secure-aggregation answer was replayed; the state stays as it was)
        if self._alpha == 1.0 or (self._alpha is None and "z_loc" not in self._kept):
            drop.add("z_loc")
        if any(k in state and np.asarray(state[k]).nbytes > STATE_VECTOR_MAX_BYTES for k in ("Dx", "DtDx")):
            drop.update(("Dx", "DtDx"))
        keep = {k: np.asarray(v) for k, v in state.items() if k not in drop}
        # arrays above the limit go to the state folder first (written and synced), then the
        # context names them: a message that fails to write changes nothing of the context
        large = {k: v for k, v in keep.items() if v.nbytes > STATE_DISK_MIN_BYTES}
        on_disk = {}
        if large:
            base = self._folder(f"party {self.party_id}'s state array(s) {sorted(large)}")
            folder = party_arrays.run_folder(base, context.run_id)
            before = dict(context.state[STATE_DISK]) if STATE_DISK in context.state else {}
            for k, v in large.items():
                on_disk[k] = party_arrays.put_arrays(folder, f"party{self.party_id}-{k}", {"a": v},
                                                     keep=before.get(k))
            party_arrays.evict_runs(base, folder)
        factor = self._factor_record(context)
        context.state[STATE_ARRAYS] = ArrayRecord({k: Array(v) for k, v in keep.items() if k not in large})
        if on_disk:
            context.state[STATE_DISK] = ConfigRecord(on_disk)
        elif STATE_DISK in context.state:
            del context.state[STATE_DISK]
        if factor is not None:
            context.state[STATE_FACTOR] = factor

    def _factor_record(self, context: Context):
        """The STATE_FACTOR record to keep (None: the one there is this solver's already): the
        factorization itself up to STATE_DISK_MIN_BYTES, else its key and the SHA-256 of its
        file in the state folder (written now unless this process wrote or checked it)."""
        f = self.party.solver.factorization()
        if f is None:
            return None
        kept = context.state[STATE_FACTOR] if STATE_FACTOR in context.state else None
        ours = kept is not None and "key" in kept and np.array_equal(kept["key"].numpy(), self._factor_key)
        f = {k: np.asarray(v) for k, v in f.items()}
        if sum(v.nbytes for v in f.values()) <= STATE_DISK_MIN_BYTES:
            return None if ours and "sha" not in kept else ArrayRecord(
                {"key": Array(self._factor_key), **{k: Array(v) for k, v in f.items()}})
        try:
            folder = self._folder(f"party {self.party_id}'s x-update factorization") / "shared"
        except StateDirRequired:
            # no state folder on this deployed node: the factorization is only a cache, so it is
            # not kept (each message factorizes) rather than put in a context too large to keep
            return None
        stem = self._factor_stem()
        sha = _FACTOR_FILES.get(stem)
        if sha is None or not (folder / f"{stem}-{sha}.npz").is_file():
            sha = party_arrays.put_arrays(folder, stem, f)
            _FACTOR_FILES[stem] = sha
            party_arrays.evict_shared(folder)
        if ours and "sha" in kept and bytes(kept["sha"].numpy()).hex() == sha:
            return None
        return ArrayRecord({"key": Array(self._factor_key),
                            "sha": Array(np.frombuffer(bytes.fromhex(sha), dtype=np.uint8).copy())})

    def _eval_scores(self, inputs, final, context):
        if self.block is not None:           # the network's forward pass: the engine's predict
            return self.block.predict(self.D_test, self.party.x)
        return released_scores(self.D_test, self.party.x)      # the predict job's code on the held-out rows

    def _reply_extra(self, content, refusal):
        if not refusal:
            content["meta"]["penalty"] = float(self.lam * self.party.penalty_value())
