"""Keys and certificates: mode 0600 from creation, no symlink following, exact SANs,
per-node identity keys, and results kept inside the app's output folder."""

from __future__ import annotations

import ipaddress
import json
import os
import stat

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402

from fedclust.cli import main  # noqa: E402
from fedclust.core.exceptions import ValidationError  # noqa: E402
from fedclust.core.policy import write_private_atomic  # noqa: E402


def _sans(path):
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (san.get_values_for_type(x509.IPAddress), san.get_values_for_type(x509.DNSName))


def test_sans_are_exactly_the_hosts_loopback_only_when_asked(tmp_path):
    from fedclust.flower.pki import write_certificates

    p = write_certificates(tmp_path / "a", ["10.0.0.5", "link.example.org"])
    assert _sans(p["server_cert"]) == ([ipaddress.ip_address("10.0.0.5")], ["link.example.org"])
    q = write_certificates(tmp_path / "b", ["10.0.0.5"], loopback=True)
    assert _sans(q["server_cert"]) == ([ipaddress.ip_address(a) for a in
                                        ("10.0.0.5", "127.0.0.1", "::1")], ["localhost"])
    assert main(["flower", "certs", str(tmp_path / "c"), "--host", "10.0.0.7"]) == 0
    assert _sans(tmp_path / "c" / "server.pem") == ([ipaddress.ip_address("10.0.0.7")], [])


def test_private_keys_are_0600_from_creation_and_force_replaces_a_symlink(tmp_path):
    from fedclust.flower.pki import write_node_keys

    old = os.umask(0)  # a permissive umask must not widen a private key
    try:
        paths = write_node_keys(tmp_path, 1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(paths["private"][0]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths["public"][0]).st_mode) == 0o644
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    key = tmp_path / "node-0"
    key.unlink()
    key.symlink_to(victim)
    with pytest.raises(ValidationError, match="exists; pass --force"):
        write_node_keys(tmp_path, 1)  # a dangling or live symlink counts as existing
    write_node_keys(tmp_path, 1, overwrite=True)
    assert victim.read_text() == "keep me"  # the link was replaced, not written through
    assert not key.is_symlink() and stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "ledger.json"
    target.write_text("old")

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_private_atomic(target, b"new", overwrite=True)
    assert target.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


def test_each_node_makes_its_own_identity_and_sends_the_public_half(tmp_path, capsys):
    from fedclust.flower.pki import SECAGG_DIRECTORY, load_secagg_identity

    pubs = []
    for z in (3, 8):
        node = tmp_path / f"node{z}"
        assert main(["flower", "secagg-key", str(node), "--device-id", str(z)]) == 0
        pem = node / f"secagg-{z}.pem"
        assert stat.S_IMODE(os.stat(pem).st_mode) == 0o600
        pub = node / f"secagg-{z}.pub.json"
        assert "PRIVATE" not in pub.read_text() and json.loads(pub.read_text())["device_id"] == z
        pubs.append(str(pub))
    directory = tmp_path / SECAGG_DIRECTORY
    assert main(["flower", "secagg-directory", str(directory), *pubs]) == 0
    ident = load_secagg_identity(tmp_path / "node3" / "secagg-3.pem", directory)
    assert sorted(ident.directory) == [3, 8]
    from fedclust.core.secagg import sign, verify

    assert verify(ident.directory[3], sign(ident.private, b"m"), b"m")
    assert not verify(ident.directory[8], sign(ident.private, b"m"), b"m")
    bad = tmp_path / "bad.pub.json"
    bad.write_text(json.dumps({"device_id": 3, "public": "00" * 32}))
    assert main(["flower", "secagg-directory", str(tmp_path / "d2.json"), pubs[0],
                 str(bad)]) != 0
    assert "a second, different key for device 3" in capsys.readouterr().err
    assert not (tmp_path / "d2.json").exists()
    # `keys` no longer makes identities for every node unless asked
    assert main(["flower", "keys", str(tmp_path / "k"), "--nodes", "2"]) == 0
    assert not list((tmp_path / "k").glob("secagg-*"))


def test_result_dir_confined_to_the_apps_output_folder(tmp_path):
    from fedclust.flower.apps import confine_result_dir

    root = tmp_path / "app" / "result"
    root.mkdir(parents=True)
    assert confine_result_dir("run1", root) == str((root / "run1").resolve())
    assert confine_result_dir(str(root), root) == str(root.resolve())
    for bad in ("/etc", "../elsewhere", str(tmp_path / "app"), "run1/../../x"):
        with pytest.raises(ValidationError, match="outside the app's output folder"):
            confine_result_dir(bad, root)
    (root / "link").symlink_to(tmp_path)  # a symlink out of the folder does not escape
    with pytest.raises(ValidationError, match="outside the app's output folder"):
        confine_result_dir("link/x", root)
