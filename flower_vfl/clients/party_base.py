"""What every vertical party shares: the trust boundary on each message, and the reply.

A party owns its column block D_m and x_m. Every message first passes the party's trust
boundary (:mod:`flower_vfl.privacy.boundary`): fields, dtypes, shapes, finiteness, scalar
ranges (and the party's own ``min-rho``/``max-rho``) and round order are checked before
anything touches state or budget, and a bad message gets a refusal naming the field. The
handlers here (``identify``, ``train``, ``evaluate``) do that through the one entry every party
shares (:class:`~flower_vfl.clients.base.PartyBase`: the packed-wire decode, parse before any
math, the reply and the refusal); what a party releases is its subclass's:
:class:`~flower_vfl.clients.party_public.PublicPartyClient` (exact values) or :class:`~flower_vfl.clients.party_private.PrivatePartyClient` (noisy values
charged in its ledger). Replies carry only N-vectors and scalar metadata: never x_m, never
anything about the noise's origin. Glue only: the math is in :mod:`flower_vfl.core`.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from flower_vfl.clients.base import STATE_META, PartyBase
from flower_vfl.io.wire import PACKED_FIELD
from flower_vfl.privacy.boundary import (MAX_OUTPUTS, TARGET_FIELD, InvalidMessage, Refused, parse_count, parse_flag,
                                        parse_round, private_rho_range)
from flower_vfl.secagg.errors import SecAggError

__all__ = ["PartyClient", "STATE_META"]

#: the message types this party reads with their arrays packed into the config record, told to the
#: central node at identify (:mod:`flower_vfl.io.wire`); the reply to a packed request is packed
PACKED_TYPES = ("train", "evaluate")


class PartyClient(PartyBase):
    """Party m of vertical ADMM sharing, usable from any Flower ``ClientApp`` (the shared part).

    Parameters
    ----------
    party_id : int
        The party this node serves (``partition-id`` in the node config).
    D, D_test : array or sparse matrix
        The party's own training and held-out column blocks (same columns).
    penalty : str, default='l2'
    lam : float, default=1e-4
    constraint : None, ('ball', r) or ('box', lo, hi)
    l1_ratio : float, default=0.5
    privacy : flower_vfl.privacy.PrivacyConfig or None
        The party's own privacy settings and budget; None releases exact values.
    n_parties : int, default=2
        M (only used by the paper's Lemma 1 calibration).
    state_dir : str or None
        The party's own folder for its ledger and answers (node config ``state-dir``).
    max_answers : int, default=0
        A non-private party's cap on answers per run (node config ``max-answers``; 0: none).
    x_solver : {'auto', 'gram', 'cg', 'dual', 'chol'}, default='auto'
        The x-update method (:mod:`flower_vfl.core.xsolve`).
    source : flower_vfl.clients.source.DeclaredSource or None
        The data the node config declares: a private party's ledger key. None: the
        ``partition-id`` only (direct use from Python; a ClientApp always passes one).
    rho_range : (float, float) or None
        The party's own bounds on the ρ it accepts (node config ``min-rho``/``max-rho``). A
        private party fills an unset end from its own row count
        (:func:`~flower_vfl.privacy.boundary.private_rho_range`: 1e-3/N .. 1e3/N).
    secagg : flower_vfl.clients.party_secagg.PartySecAgg or None
        The party's secure-aggregation settings (node config ``secagg-*``); None: the defaults
        (unpinned, honest-but-curious central node only) when a message asks for a masked reply.
    """

    #: True for a party that releases noisy values and keeps a ledger
    private = False
    #: train and evaluate requests may come packed (:data:`PACKED_TYPES`); their replies go packed
    READS_PACKED = True
    #: a refusal of the trust boundary, of the ledger or of secure aggregation is the refusal reply
    REFUSALS = (Refused, SecAggError)

    def __init__(self, party_id, D, D_test, penalty="l2", lam=1e-4, constraint=None, l1_ratio=0.5,
                 privacy=None, n_parties=2, state_dir=None, max_answers=0, x_solver="auto", source=None,
                 rho_range=None, secagg=None):
        self.party_id = int(party_id)
        self.x_solver = x_solver
        self.D, self.D_test = D, D_test
        self.penalty, self.lam, self.constraint, self.l1_ratio = penalty, lam, constraint, l1_ratio
        self.privacy = privacy
        self.n_parties = n_parties
        self.state_dir = state_dir
        self.max_answers = int(max_answers or 0)
        self.source = source
        # a private party never answers at any rho: its budget buys releases at the loss's scale only
        self.rho_range = rho_range if privacy is None else private_rho_range(D.shape[0], rho_range)
        self.secagg = secagg
        self.party = None

    # ------------------------------------------------------ what a subclass releases
    def _build(self, context: Context, n_outputs: int, plain: bool = False):
        """The party's x-update object for this run (restored from its state); ``plain``: the
        request's :meth:`_plain_rounds`."""
        raise NotImplementedError

    def _plain_rounds(self, cfg) -> bool:
        """The train request's ``config['plain_rounds']`` (:data:`~flower_vfl.core.party.PLAIN_ROUNDS`:
        no accelerator runs, so the x-update may be looser). A private party ignores it, unread:
        its x-update is its own whatever the server says."""
        return False

    def _identity(self, context: Context) -> dict:
        """What identify adds to the party's row counts."""
        raise NotImplementedError

    def _train_release(self, inputs, meta: dict, context: Context):
        """The vector s_m this round releases (``self.party`` is built)."""
        raise NotImplementedError

    def _after_train(self, context: Context):
        """Keep what the next message of this run needs (called once the release is made)."""

    def _eval_scores(self, inputs, final: bool, context: Context):
        """The held-out scores D_test x this party shows (``self.party`` is built)."""
        raise NotImplementedError

    def _reply_extra(self, content: RecordDict, refusal: bool):
        """Add to a reply what the party tells the server besides the vectors."""

    # ----------------------------------------------------------------- state
    def _meta(self, context: Context) -> dict:
        if STATE_META in context.state:
            return dict(context.state[STATE_META])
        return {"n_outputs": 0, "last_train": -1, "answers": 0, "last_hash": ""}

    def _n_outputs(self, content, meta, context) -> int:
        """1 for scalar losses; K for multinomial, pinned by the run's first training message
        (a later change of shape is refused)."""
        if meta["n_outputs"]:
            return int(meta["n_outputs"])
        if str(context.run_config.get("loss", "logistic")) != "multinomial":
            return 1
        try:                 # q, or the target v sent alone (privacy/boundary.py: TARGET_FIELD)
            vec = content["vectors"]
            shape = (vec["q"] if "q" in vec else vec[TARGET_FIELD]).shape
        except Exception:
            raise InvalidMessage(f"party {self.party_id}: message field vectors['q'] is missing",
                                 field="vectors.q") from None
        k = 1 if len(shape) == 1 else int(shape[1]) if len(shape) == 2 else -1
        if not (k == 1 or 2 <= k <= 1000) or (self.private and k != 1):
            raise InvalidMessage(f"party {self.party_id}: vectors['q'] has shape {tuple(shape)}; expected "
                                 f"({self.D.shape[0]},){'' if self.private else ' or (N, K) with 2 <= K <= 1000'}",
                                 field="vectors.q")
        return k

    # -------------------------------------------------------- secure aggregation
    def _secagg(self, content):
        """The party's secure-aggregation settings when the request ``content`` asks for a masked
        reply (None: a plain one, refused under the node config's ``secagg-only``)."""
        from flower_vfl.clients.party_secagg import PartySecAgg, secagg_fields
        sa = self.secagg if self.secagg is not None else \
            PartySecAgg(self.party_id, {"state-dir": self.state_dir}, self.private)
        if secagg_fields(content) is None:
            if sa.only:
                raise Refused(f"party {self.party_id} releases only under secure aggregation (node config "
                              "secagg-only); this request asks for a plain release: refused (set secagg=true "
                              "in the run config)", field="config.secagg.adverts")
            sa.check_plain()        # answered a secure sum before: no plain release (a roster of one)
            return None
        return sa

    def _answer(self, content, context, kind, rnd, compute):
        sa = self._secagg(content)
        self._mask_digest = None
        if sa is None:
            # a plain release is a sum over this party alone: recorded (pinned keys) before anything is
            # computed or charged, as a secure sum's roster is: a secure sum claiming the roster between a
            # check here and a claim after compute() made the refusal come after a private party's charge
            if self.secagg is not None:
                self.secagg.claim_plain()
            return compute()
        from flower_vfl.clients.psi_party import bound_to_alignment
        history = bound_to_alignment(context, self._history(context, kind, rnd), kind)   # the block's rows now
        out = sa.masked_answer(content, context, kind, rnd, compute, history=history)
        self._mask_digest = sa.mask_digest
        return out

    def _history(self, context: Context, kind: str, rnd: int):
        """What a non-private party's masked answer is bound to besides the broadcast: the history of the
        broadcasts its state comes from (hex; "": none). Parties in one sum must share it, so a central node
        that fed one party another broadcast once (a garbage sum, but that party's state moved), or resumed
        parties from different runs' tokens, gets no sum of parties whose states differ: two such sums
        differenced would be the one party's exact release. None for a private party (its releases are
        noisy, fresh or its stored draw). A re-sent request for the last answered train round is bound to
        the history before that round; a fresh state starts from the training row order it agreed to (own
        data: :func:`~flower_vfl.clients.psi_party.history_seed`)."""
        if self.private:
            return None
        meta = self._meta(context)
        if "chain" not in meta:
            from flower_vfl.clients.psi_party import history_seed
            return history_seed(context) if int(meta["last_train"]) < 0 else ""
        if kind == "train" and int(rnd) == int(meta["last_train"]):
            return str(meta.get("chain_prev", ""))
        return str(meta["chain"])

    def _keep_history(self, context: Context, meta: dict, rnd: int):
        """After a masked training answer (new, or the same round asked again under new keys): the history
        its state now comes from (the digest it was masked against)."""
        digest = getattr(self, "_mask_digest", None)
        if self.private or digest is None:
            return
        meta["chain_prev"] = self._history(context, "train", rnd)     # what this round was masked after
        meta["chain"] = digest.hex()

    def secagg_keys(self, msg: Message, context: Context) -> Message:
        """This run's signed key advert (query.secagg_keys): the key drawn once per run."""
        from flower_vfl.clients.party_secagg import PartySecAgg
        sa = self.secagg if self.secagg is not None else \
            PartySecAgg(self.party_id, {"state-dir": self.state_dir}, self.private)
        info = {"party": self.party_id, "advert": sa.advert(context)}
        return Message(RecordDict({"secagg": ConfigRecord(info)}), reply_to=msg)

    # -------------------------------------------------------------- handlers
    def _identity_fields(self, msg: Message, context: Context) -> dict:
        """Which party this node serves, the row counts to align, and (a private party) whether its
        remaining budget covers its plan."""
        info = {**self._rows_identity(),
                "train_rounds": int(self.privacy.train_rounds) if self.private else 0,
                PACKED_FIELD: ",".join(PACKED_TYPES)}
        if not self.private:     # secure aggregation: its run's resume token, its state in a resumed run
            from flower_vfl.clients.party_secagg import resume_identify
            info.update(resume_identify(self, msg, context))
        info.update(self._identity(context))
        model = getattr(self, "party_model", None)     # its block kind and settings (apps/client.py), no data
        info["party_model"] = "linear" if model is None else model.describe()
        return info

    def train(self, msg: Message, context: Context) -> Message:
        """One x-update (eq. 6); replies with s_m = D_m x_m (noisy when private)."""
        meta = self._meta(context)

        def parse(content):
            n_out = self._n_outputs(content, meta, context)
            return content, n_out, parse_round(content, n_rows=self.D.shape[0], party=self.party_id,
                                               needs_vectors=True, n_outputs=n_out, rho_range=self.rho_range,
                                               accept_target=True)

        def answer(parsed):
            content, n_out, inputs = parsed
            plain = self._plain_rounds(content["config"])
            self.party = self._build(context, n_out, plain)
            s = self._answer(content, context, "train", inputs.round,
                             lambda: self._train_release(inputs, meta, context))
            return content, n_out, inputs, s

        def reply(done):         # what the next message of this run needs, kept once the release is made
            content, n_out, inputs, s = done
            meta["n_outputs"] = n_out
            if getattr(self, "_alpha", None) is not None:      # answered now (not a stored masked answer)
                self._keep_history(context, meta, inputs.round)
            self._after_train(context)
            context.state[STATE_META] = ConfigRecord(meta)
            if not self.private:     # secure aggregation: its state on its own disk, for a resume (party_secagg.py)
                from flower_vfl.clients.party_secagg import keep_for_resume
                keep_for_resume(self, content, context, meta)
            return self._reply(msg, {"s": s}, inputs.round, inputs.wire)
        return self._handle(msg, parse, answer, reply)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Held-out scores D_test x_m (a private party's: from its released x~)."""
        meta = self._meta(context)

        def parse(content):
            cfg = content["config"] if "config" in content else {}
            asked_final = parse_flag(cfg, "final_update", self.party_id)
            n_out = meta["n_outputs"] or parse_count(   # the party's own limits (as train's vectors['q'])
                cfg, "n_outputs", self.party_id, default=1, lo=1, hi=1 if self.private else MAX_OUTPUTS,
                why=" (this party is private: one score column)" if self.private else "")
            final = self.private and asked_final
            return content, asked_final, final, n_out, parse_round(
                content, n_rows=self.D.shape[0], party=self.party_id, needs_vectors=final, n_outputs=n_out,
                rho_range=self.rho_range)

        def answer(parsed):
            content, asked_final, final, n_out, inputs = parsed
            self.party = self._build(context, n_out, bool(meta.get("plain_rounds", False)))
            final_kind = "evaluate-final" if asked_final else "evaluate"
            s_test = self._answer(content, context, final_kind, inputs.round,
                                  lambda: self._eval_scores(inputs, final, context))
            return inputs, s_test
        return self._handle(msg, parse, answer,
                            lambda done: self._reply(msg, {"s_test": done[1]}, done[0].round, done[0].wire))
