"""`flower-vfl certs` (flower_vfl/cli/certs.py): the files docs/two-machines.md uses. The end-to-end
use (a SuperLink with TLS and SuperNode authentication, registered keys, party-keys) is
tests/test_two_machines_page.py; here, in-process: the certificate chain and names, the key
formats Flower reads, the fingerprint the strategy compares, and the refusals, by their message."""

import hashlib
import json
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from flower_vfl.cli.certs import fingerprint, make_node_key, make_superlink_pki, party_keys
from flower_vfl.cli.commands import main as cli
from flower_vfl.config.schema import ConfigError
from flower_vfl.strategies.exchange import key_fingerprint


def test_superlink_certificate_is_signed_by_the_ca_for_every_host(tmp_path):
    p = make_superlink_pki(tmp_path / "pki", ["superlink.example.org", "10.0.0.5"], days=30)
    ca = x509.load_pem_x509_certificate(p["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(p["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)                       # raises unless the CA signed it
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["superlink.example.org"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    for key in (p["ca_key"], p["key"]):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert p["ca_sha256"] == hashlib.sha256(ca.public_bytes(serialization.Encoding.DER)).hexdigest()
    # a second SuperLink certificate from the same CA (another folder's key is never overwritten)
    (tmp_path / "pki" / "superlink.key").unlink()
    again = make_superlink_pki(tmp_path / "pki", ["other.example.org"])
    assert again["ca_reused"]
    x509.load_pem_x509_certificate(again["cert"].read_bytes()).verify_directly_issued_by(ca)


def test_node_key_is_openssh_p384_and_its_fingerprint_is_the_superlinks(tmp_path):
    p = make_node_key(tmp_path, "clinic")
    priv = serialization.load_ssh_private_key(p["private"].read_bytes(), password=None)
    assert isinstance(priv, ec.EllipticCurvePrivateKey) and priv.curve.name == "secp384r1"
    assert stat.S_IMODE(p["private"].stat().st_mode) == 0o600
    assert p["public"].read_text().startswith("ecdsa-sha2-nistp384 ")
    # what the SuperLink stores for the node (PEM SubjectPublicKeyInfo) and the strategy compares
    spki = priv.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert p["fingerprint"] == key_fingerprint(spki) == fingerprint(p["public"])


def test_party_keys_file_binds_every_party(tmp_path):
    keys = [make_node_key(tmp_path, name) for name in ("hospital", "clinic")]
    out = tmp_path / "party-keys.json"
    assert cli(["certs", "party-keys", "--out", str(out), f"1={keys[1]['public']}", f"0={keys[0]['public']}"]) == 0
    assert json.loads(out.read_text()) == {"0": keys[0]["fingerprint"], "1": keys[1]["fingerprint"]}
    from flower_vfl.strategies.exchange import load_party_keys
    assert load_party_keys(str(out), 2) == {0: keys[0]["fingerprint"], 1: keys[1]["fingerprint"]}


def test_refusals_name_the_fix(tmp_path):
    a = make_node_key(tmp_path, "a")
    with pytest.raises(ConfigError, match=r"^parties 0, 2: name every party 0\.\.1 once \(the partition-id of each "
                                          r"SuperNode\)$"):
        party_keys(tmp_path / "k.json", [f"0={a['public']}", f"2={a['public']}"])
    with pytest.raises(ConfigError, match="^two parties have the same key: every SuperNode needs its own key pair"):
        party_keys(tmp_path / "k.json", [f"0={a['public']}", f"1={a['public']}"])
    with pytest.raises(ConfigError, match=r"^'hospital.pub': give PARTY=PUBLIC_KEY_FILE, e.g. 0=keys/hospital.pub$"):
        party_keys(tmp_path / "k.json", ["hospital.pub"])
    with pytest.raises(ConfigError, match=r"exists: remove it first or choose another --name$"):
        make_node_key(tmp_path, "a")
    with pytest.raises(ConfigError, match=r"^--host 'bad host' is neither an IP address nor a DNS name"):
        make_superlink_pki(tmp_path / "x", ["bad host"])
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "ca.crt").write_text("x")
    with pytest.raises(ConfigError, match="holds one of ca.crt / ca.key but not the other"):
        make_superlink_pki(tmp_path / "half", ["h.example.org"])
