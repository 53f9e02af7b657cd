"""Key agreement for the secure sum: signed X25519 adverts, pinned Ed25519 identities.

Each party holds a long-term Ed25519 signing key (a PEM file named in its node config) and the
Ed25519 public keys of the other institutions, pinned in its node config the way institutions
exchange certificates. Per run it draws a fresh X25519 key pair (OS entropy) and publishes an
:class:`Advert`: its name, the run, the X25519 public key and the entry-wise bound of its
releases (the fixed-point range, :mod:`flower_vfl.secagg.quantize`), signed with its Ed25519 key.
The central node only relays the adverts. A party accepts the relayed set (:func:`verify_roster`)
only if its own advert is in it unchanged, every advert is for this run, names are unique, there
are at least ``min_parties``, and (with pins) every other advert's signature verifies under the
key pinned for its name. Without pins it accepts unsigned adverts: then a malicious central node
can substitute its own X25519 keys and read every release, so the guarantee is against an
honest-but-curious central node only (docs/secagg.md).

Pairwise seeds: ``HKDF-SHA256(X25519(a, B), salt = roster digest, info = both names and keys)``.
The roster digest covers every advert, so parties shown different rosters derive different seeds.
Primitives from ``cryptography`` only; nothing here is home-made crypto.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flower_vfl.secagg.errors import KeyRefused
from flower_vfl.secagg.quantize import FixedPoint

__all__ = ["TAG", "frame", "Advert", "Roster", "KeyAgreement", "verify_roster", "load_signing_key",
           "signing_key_pem", "public_key_hex", "parse_pins"]

#: domain separation for every hash, signature and KDF input of this protocol
TAG = b"flower-vfl/secagg/v1"
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def frame(*fields: bytes) -> bytes:
    """Unambiguous concatenation: each field prefixed by its 4-byte length."""
    return b"".join(struct.pack(">I", len(f)) + f for f in fields)


def unframe(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        if i + 4 > len(data):
            raise ValueError("truncated length")
        (n,) = struct.unpack(">I", data[i:i + 4])
        if i + 4 + n > len(data):
            raise ValueError("truncated field")
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


@dataclass(frozen=True)
class Advert:
    """One party's signed key-agreement message for one run (the central node relays it)."""

    name: str
    run: str
    dh_public: bytes
    bound: float
    signature: bytes = b""
    #: optional: the party's distributed-noise profile (:func:`flower_vfl.privacy.distributed.profile`),
    #: signed with the rest; empty for a party that adds no noise share (the advert's bytes are then
    #: those of an advert without the field)
    noise: bytes = b""

    def signed_bytes(self) -> bytes:
        fields = [TAG, b"advert", self.name.encode(), self.run.encode(), self.dh_public, struct.pack(">d", self.bound)]
        return frame(*fields, *((self.noise,) if self.noise else ()))

    def to_bytes(self) -> bytes:
        return frame(self.signed_bytes(), self.signature)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Advert":
        try:
            signed, signature = unframe(bytes(data))
            fields = unframe(signed)
            if len(fields) not in (6, 7):
                raise ValueError(f"{len(fields)} fields, expected 6 or 7")
            tag, kind, name, run, dh_public, bound = fields[:6]
            noise = fields[6] if len(fields) == 7 else b""
            if tag != TAG or kind != b"advert" or (len(fields) == 7 and not noise):
                raise ValueError("not a flower-vfl secagg v1 advert")
            adv = cls(name.decode(), run.decode(), dh_public, struct.unpack(">d", bound)[0], signature, noise)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            raise KeyRefused(f"malformed key advert ({exc}); refused") from None
        adv.check()
        return adv

    def check(self):
        if not _NAME.match(self.name):
            raise KeyRefused(f"advert name {self.name!r}: use 1-64 characters from A-Z a-z 0-9 _ . : @ -")
        if len(self.dh_public) != 32:
            raise KeyRefused(f"party {self.name!r}: X25519 public key of {len(self.dh_public)} bytes, not 32")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise KeyRefused(f"party {self.name!r}: declared bound {self.bound!r} is not a finite number > 0")
        if not isinstance(self.noise, bytes) or len(self.noise) > 256:
            raise KeyRefused(f"party {self.name!r}: the noise profile of its advert must be at most 256 bytes")


class Roster:
    """The set of parties of one secure sum, sorted by name (party and central node build the
    same one from the same adverts). ``digest`` binds every advert; ``fixed_point`` is the code
    derived from the declared bounds."""

    def __init__(self, adverts: Sequence[Advert]):
        adverts = sorted(adverts, key=lambda a: a.name)
        names = [a.name for a in adverts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise KeyRefused(f"the roster names parties {dup} more than once; refused")
        runs = {a.run for a in adverts}
        if len(runs) > 1:
            raise KeyRefused(f"the roster mixes runs {sorted(runs)}; refused")
        self.adverts = tuple(adverts)
        self.names = tuple(names)
        self.run = adverts[0].run if adverts else ""
        self.digest = hashlib.sha256(frame(TAG, b"roster", *(a.to_bytes() for a in adverts))).digest()
        self.fixed_point = FixedPoint([a.bound for a in adverts])

    def __len__(self):
        return len(self.names)

    def bound(self, name: str) -> float:
        return self.adverts[self.names.index(name)].bound


def verify_roster(adverts: Sequence[Advert], pins: Mapping[str, Ed25519PublicKey | bytes] | None,
                  own: Advert, min_parties: int = 2, required: Sequence[str] = ()) -> Roster:
    """The roster a party accepts, or :class:`KeyRefused` naming the advert and the fix.

    ``pins``: name -> pinned Ed25519 public key (from the party's node config); ``None``:
    unauthenticated, honest-but-curious central node only. ``required``: names that must all be
    in the roster (e.g. every pinned institution: a central node cannot then run this party
    against a hand-picked subset, such as itself plus one colluder)."""
    adverts = [Advert.from_bytes(a) if isinstance(a, (bytes, bytearray)) else a for a in adverts]
    for a in adverts:
        a.check()
    mine = [a for a in adverts if a.name == own.name]
    if len(mine) != 1 or mine[0] != own:
        raise KeyRefused(f"party {own.name!r}: the relayed roster does not contain this party's own advert "
                         "unchanged; refused (the central node altered or dropped it)")
    wrong_run = sorted(a.name for a in adverts if a.run != own.run)
    if wrong_run:
        raise KeyRefused(f"party {own.name!r}: adverts of {wrong_run} are for another run than {own.run!r}; "
                         "refused")
    if len(adverts) < max(2, int(min_parties)):
        raise KeyRefused(f"party {own.name!r}: a secure sum of {len(adverts)} parties is below this party's "
                         f"minimum of {max(2, int(min_parties))} (node config secagg-min-parties); refused")
    absent = sorted(set(required) - {a.name for a in adverts})
    if absent:
        raise KeyRefused(f"party {own.name!r}: the roster lacks parties {absent} that this party requires "
                         "(node config secagg-require); refused")
    if pins is not None:
        for a in adverts:
            if a.name == own.name:
                continue
            if a.name not in pins:
                raise KeyRefused(f"party {own.name!r}: party {a.name!r} has no pinned key in this party's node "
                                 "config (secagg-pins); add its Ed25519 public key or leave it out of the run")
            key = pins[a.name]
            key = key if isinstance(key, Ed25519PublicKey) else Ed25519PublicKey.from_public_bytes(bytes(key))
            try:
                key.verify(a.signature, a.signed_bytes())
            except InvalidSignature:
                raise KeyRefused(f"party {own.name!r}: the advert of party {a.name!r} is not signed by the key "
                                 "pinned for it (secagg-pins); refused. Check the pinned key with that "
                                 "institution") from None
    return Roster(adverts)


class KeyAgreement:
    """One party's side of the key agreement for one run.

    Parameters
    ----------
    name : str
        The party's name as the other parties pin it.
    run : str
        The run the keys are for (the Flower run id).
    bound : float
        Entry-wise bound on this party's releases (its fixed-point range).
    signing_key : Ed25519PrivateKey or None
        The party's long-term identity; ``None``: unsigned adverts (unpinned mode).
    dh_private : bytes or None
        A stored X25519 private key of this run (the party's own state); ``None``: a fresh one.
    noise : bytes
        The party's distributed-noise profile for the advert (empty: none).
    """

    def __init__(self, name, run, bound, signing_key: Ed25519PrivateKey | None = None,
                 dh_private: bytes | None = None, noise: bytes = b""):
        self.name, self.run, self.bound = str(name), str(run), float(bound)
        self._dh = X25519PrivateKey.generate() if dh_private is None else \
            X25519PrivateKey.from_private_bytes(bytes(dh_private))
        pub = self._dh.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        unsigned = Advert(self.name, self.run, pub, self.bound, noise=bytes(noise))
        unsigned.check()
        sig = signing_key.sign(unsigned.signed_bytes()) if signing_key is not None else b""
        self.advert = Advert(self.name, self.run, pub, self.bound, sig, bytes(noise))

    def private_state(self) -> bytes:
        """The X25519 private key, for the party's own state (never sent)."""
        return self._dh.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())

    def establish(self, adverts, pins=None, min_parties: int = 2,
                  required: Sequence[str] = ()) -> tuple[Roster, dict[str, bytes]]:
        """Verify the relayed adverts (:func:`verify_roster`) and derive one 32-byte seed per
        other party."""
        roster = verify_roster(adverts, pins, self.advert, min_parties, required)
        seeds = {}
        for a in roster.adverts:
            if a.name == self.name:
                continue
            try:
                shared = self._dh.exchange(X25519PublicKey.from_public_bytes(a.dh_public))
            except ValueError:
                raise KeyRefused(f"party {self.name!r}: the X25519 key of party {a.name!r} is a low-order "
                                 "point; refused") from None
            lo, hi = sorted((a, self.advert), key=lambda v: v.name)
            info = frame(TAG, b"pair", lo.name.encode(), lo.dh_public, hi.name.encode(), hi.dh_public)
            seeds[a.name] = HKDF(hashes.SHA256(), 32, salt=roster.digest, info=info).derive(shared)
        return roster, seeds


# ---------------------------------------------------------------- identities in node configs
def load_signing_key(path) -> Ed25519PrivateKey:
    """The party's Ed25519 identity from a PEM (PKCS#8) file, unencrypted."""
    p = Path(path)
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyRefused(f"secagg-signing-key {str(p)!r}: cannot read an unencrypted PEM private key ({exc}); "
                         "make one with `openssl genpkey -algorithm ed25519 -out party.pem`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyRefused(f"secagg-signing-key {str(p)!r} is a {type(key).__name__}, not an Ed25519 key; "
                         "make one with `openssl genpkey -algorithm ed25519 -out party.pem`")
    return key


def signing_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The 64-hex-digit raw public key another institution pins."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def parse_pins(text: str) -> dict[str, Ed25519PublicKey]:
    """``"name=<64 hex digits>, name2=<...>"`` (commas or newlines) -> name -> public key."""
    pins = {}
    for item in re.split(r"[,\n]", str(text)):
        item = item.strip()
        if not item:
            continue
        name, sep, hexkey = item.partition("=")
        name, hexkey = name.strip(), hexkey.strip()
        if not sep or not _NAME.match(name) or not re.fullmatch(r"[0-9a-fA-F]{64}", hexkey):
            raise KeyRefused(f"secagg-pins entry {item!r}: write name=<64 hex digits of the Ed25519 public key>")
        if name in pins:
            raise KeyRefused(f"secagg-pins names {name!r} twice")
        pins[name] = Ed25519PublicKey.from_public_bytes(bytes.fromhex(hexkey))
    return pins
