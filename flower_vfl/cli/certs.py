"""``flower-vfl certs``: the certificates and keys of a deployment on several machines
(docs/two-machines.md).

    flower-vfl certs superlink --out pki --host superlink.example.org [--host 10.0.0.5]
    flower-vfl certs node --out keys --name clinic
    flower-vfl certs party-keys --out party-keys.json 0=keys/hospital.pub 1=clinic.pub

``superlink`` (the SuperLink operator): a CA (``ca.crt``, ``ca.key``; an existing pair in ``--out``
is reused) and the SuperLink's TLS certificate for every ``--host`` (``superlink.crt``,
``superlink.key``); the SuperNodes get ``ca.crt`` only. ``node`` (each party, on its own machine):
the SuperNode's authentication key pair, OpenSSH format as Flower reads it (``<name>``, kept by the
party; ``<name>.pub``, sent to the operator, who registers it with ``flwr supernode register``).
``party-keys`` (the operator): the run-config file ``party-keys`` binding each party to the SHA-256
fingerprint of the one registered key allowed to serve it. The formats are ``deploy-local``'s
(:func:`flower_vfl.deploy.local.make_pki`): EC P-384 keys, the fingerprint of the key's PEM
SubjectPublicKeyInfo as the SuperLink stores it (:func:`flower_vfl.strategies.exchange.key_fingerprint`).
Private keys are written with mode 0600 and never overwritten.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import re
from pathlib import Path

from flower_vfl.config.schema import ConfigError

__all__ = ["add_parser", "make_superlink_pki", "make_node_key", "fingerprint", "party_keys"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _write_private(path: Path, data: bytes) -> None:
    if path.exists():
        raise ConfigError(f"{path} exists: a private key is never overwritten; remove it first or choose "
                          "another --out / --name")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _sans(hosts):
    from cryptography import x509
    out = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?", h):
                raise ConfigError(f"--host {h!r} is neither an IP address nor a DNS name; give the address "
                                  "the SuperNodes and flwr will use to reach the SuperLink") from None
            out.append(x509.DNSName(h))
    return out


def make_superlink_pki(out, hosts, days: int = 365) -> dict:
    """CA + SuperLink certificate in ``out`` for ``hosts`` (DNS names or IPs the SuperLink is
    reached at). An existing ``ca.crt`` + ``ca.key`` there signs the new certificate; otherwise a
    new CA is made. Returns the paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hosts = [str(h) for h in hosts]
    if not hosts:
        raise ConfigError("flower-vfl certs superlink needs at least one --host: the DNS name or IP address the "
                          "SuperNodes and flwr use to reach the SuperLink (e.g. --host superlink.example.org)")
    if int(days) < 1:
        raise ConfigError(f"--days={days}: give the certificates' validity in days (>= 1)")
    sans = _sans(hosts)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"ca": out / "ca.crt", "ca_key": out / "ca.key", "cert": out / "superlink.crt",
             "key": out / "superlink.key"}
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=int(days)))

    def builder(subject, issuer, pub):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
                .serial_number(x509.random_serial_number()).not_valid_before(valid[0]).not_valid_after(valid[1]))

    if paths["ca"].exists() != paths["ca_key"].exists():
        raise ConfigError(f"{out} holds one of ca.crt / ca.key but not the other; keep both (to reuse the CA) "
                          "or neither (to make a new one)")
    if paths["ca"].exists():
        ca_cert = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
        ca_key = serialization.load_pem_private_key(paths["ca_key"].read_bytes(), password=None)
        paths["ca_reused"] = True
    else:
        ca_key = ec.generate_private_key(ec.SECP384R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower-vfl deployment CA")])
        ca_cert = (builder(name, name, ca_key.public_key())
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                key_cert_sign=True, crl_sign=True, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        _write_private(paths["ca_key"], ca_key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
        paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        paths["ca_reused"] = False
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]), ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_private(paths["key"], key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["ca_sha256"] = hashlib.sha256(ca_cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return paths


def make_node_key(out, name: str) -> dict:
    """A SuperNode's authentication key pair in ``out``: ``<name>`` (private, OpenSSH) and
    ``<name>.pub``. Returns the paths and the public key's fingerprint."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    if not _NAME.match(name or ""):
        raise ConfigError(f"--name {name!r}: give a file name of letters, digits, '.', '_' or '-' (e.g. clinic)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    priv, pub = out / name, out / f"{name}.pub"
    if pub.exists():
        raise ConfigError(f"{pub} exists: remove it first or choose another --name")
    k = ec.generate_private_key(ec.SECP384R1())
    _write_private(priv, k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                         serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                    + b"\n")
    return {"private": priv, "public": pub, "fingerprint": fingerprint(pub)}


def fingerprint(public_key_path) -> str:
    """SHA-256 (hex) of a SuperNode public key file (OpenSSH or PEM) as the SuperLink stores the
    key: its PEM SubjectPublicKeyInfo bytes (what ``party-keys`` holds)."""
    from cryptography.hazmat.primitives import serialization
    path = Path(public_key_path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the public key {path}: {exc.strerror}") from None
    try:
        key = (serialization.load_ssh_public_key(raw) if raw.lstrip().startswith(b"ecdsa-")
               else serialization.load_pem_public_key(raw))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not a SuperNode public key (OpenSSH 'ecdsa-sha2-...' or PEM): {exc}") from None
    spki = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def party_keys(out, pairs) -> dict[str, str]:
    """``party-keys`` JSON in ``out`` from ``['0=hospital.pub', '1=clinic.pub']``; every party
    0..M-1 once."""
    mapping = {}
    for item in pairs:
        party, sep, path = str(item).partition("=")
        if not sep or not party.strip().isdigit() or not path:
            raise ConfigError(f"{item!r}: give PARTY=PUBLIC_KEY_FILE, e.g. 0=keys/hospital.pub")
        if party.strip() in mapping:
            raise ConfigError(f"party {party.strip()} is given twice; one key per party")
        mapping[str(int(party))] = fingerprint(path)
    want = [str(m) for m in range(len(mapping))]
    if sorted(mapping, key=int) != want:
        raise ConfigError(f"parties {', '.join(sorted(mapping, key=int))}: name every party 0..{len(mapping) - 1} once "
                          "(the partition-id of each SuperNode)")
    if len(set(mapping.values())) != len(mapping):
        raise ConfigError("two parties have the same key: every SuperNode needs its own key pair "
                          "(flower-vfl certs node --name ...)")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(dict(sorted(mapping.items(), key=lambda kv: int(kv[0]))), indent=2) + "\n")
    return mapping


def cmd_certs(args) -> int:
    if args.what == "superlink":
        p = make_superlink_pki(args.out, args.host, args.days)
        print(f"CA: {p['ca']} ({'reused' if p['ca_reused'] else 'new'}; its key {p['ca_key']} stays with the "
              f"operator)\n  SHA-256 {p['ca_sha256']} (tell the parties; they check the copy they get)")
        print(f"SuperLink: {p['cert']} + {p['key']} for {', '.join(args.host)}, valid {args.days} days")
        print(f"send {p['ca']} to every SuperNode (--root-certificates) and use it in flwr's connection "
              "(root-certificates)")
    elif args.what == "node":
        p = make_node_key(args.out, args.name)
        print(f"SuperNode key: {p['private']} (stays on this machine: --auth-supernode-private-key)")
        print(f"public key: {p['public']} (send to the SuperLink operator: flwr supernode register)")
        print(f"  SHA-256 {p['fingerprint']}")
    else:
        mapping = party_keys(args.out, args.pairs)
        for m, fp in mapping.items():
            print(f"party {m}: {fp}")
        print(f"wrote {args.out} (run config: party-keys='{Path(args.out).resolve()}')")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("certs", help="CA, SuperLink certificate, SuperNode keys, party-keys (docs/two-machines.md)",
                       description=__doc__.split("\n\n")[0])
    what = p.add_subparsers(dest="what", required=True)
    s = what.add_parser("superlink", help="the CA and the SuperLink's TLS certificate (the operator)")
    s.add_argument("--out", required=True, help="folder for ca.crt, ca.key, superlink.crt, superlink.key")
    s.add_argument("--host", action="append", default=[], required=True,
                   help="DNS name or IP address the SuperLink is reached at (repeat for several)")
    s.add_argument("--days", type=int, default=365, help="validity of the certificates (default 365)")
    s = what.add_parser("node", help="a SuperNode's authentication key pair (each party, on its machine)")
    s.add_argument("--out", required=True, help="folder for <name> and <name>.pub")
    s.add_argument("--name", required=True, help="the key's file name, e.g. clinic")
    s = what.add_parser("party-keys", help="the run config's party-keys file from the parties' public keys")
    s.add_argument("--out", required=True, help="the JSON file to write, e.g. party-keys.json")
    s.add_argument("pairs", nargs="+", metavar="PARTY=PUBLIC_KEY", help="e.g. 0=keys/hospital.pub 1=clinic.pub")
    p.set_defaults(fn=cmd_certs)
