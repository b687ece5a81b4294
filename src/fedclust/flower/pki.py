"""TLS certificates and SuperNode authentication keys for a Flower deployment.

``fedclust flower certs DIR --host NAME_OR_IP ...`` writes, with the
``cryptography`` library (no openssl needed):

* ``ca.crt`` / ``ca.key`` — a self-signed certificate authority (ECDSA P-384).
  ``ca.crt`` goes to every SuperNode (``--root-certificates ca.crt``) and to
  every machine that runs ``flwr`` (``root-certificates`` of the SuperLink
  connection); ``ca.key`` stays offline with whoever signs certificates;
* ``server.pem`` / ``server.key`` — the SuperLink's certificate, signed by the
  CA, with exactly the given host names / IP addresses as subject alternative
  names; ``--loopback`` adds ``127.0.0.1``, ``::1`` and ``localhost`` (needed
  when the SuperLink's own SuperExec, which starts the ServerApp, connects to
  it over loopback with the same TLS), for ``flower-superlink --ssl-ca-certfile
  ca.crt --ssl-certfile server.pem --ssl-keyfile server.key``.

``fedclust flower keys DIR --nodes N`` writes the SuperNode authentication
keys in the format Flower 1.42 reads (OpenSSH ECDSA on a NIST curve, as
``ssh-keygen -t ecdsa -b 384`` makes them):

* ``node-<i>`` — private key of SuperNode *i* (mode 0600), for
  ``flower-supernode --auth-supernode-private-key node-<i>``; it stays on that node;
* ``node-<i>.pub`` — its public key, registered on the SuperLink with
  ``flwr supernode register node-<i>.pub SUPERLINK`` (SuperLink started with
  ``--enable-supernode-auth``);
* ``public-keys.csv`` — all public keys on one comma-separated line, the list
  older Flower releases took as ``--auth-list-public-keys``.

``fedclust flower secagg-key DIR --device-id Z`` runs on the node that holds
device ``Z``: it writes that node's secure-aggregation identity key
``secagg-<Z>.pem`` (never leaves the node) and its public half
``secagg-<Z>.pub.json``, which is all the node sends out.
``fedclust flower secagg-directory OUT.json PUB...`` assembles the public
halves into the directory every node gets (not through the server).

Every private key is written atomically with mode 0600 from its creation: a
new temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``) in the target folder,
renamed over the target, so ``--force`` replaces a symlink, never writes
through it.

Nothing here is a cipher of our own: keys, signatures and certificates are made
by ``cryptography``; TLS and node authentication are Flower's.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from pathlib import Path
from typing import Sequence

from ..core.exceptions import ValidationError
from ..core.policy import write_private_atomic

__all__ = ["write_certificates", "write_node_keys", "write_secagg_identities",
           "write_secagg_key", "write_secagg_directory",
           "load_secagg_identity", "CA_CERT", "CA_KEY", "SERVER_CERT", "SERVER_KEY",
           "PUBLIC_KEYS_CSV", "SECAGG_DIRECTORY"]

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
PUBLIC_KEYS_CSV = "public-keys.csv"
SECAGG_DIRECTORY = "secagg-identities.json"
_LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


def _write(path: Path, data: bytes, *, private: bool, overwrite: bool) -> Path:
    return write_private_atomic(path, data, overwrite=overwrite,
                                mode=0o600 if private else 0o644)


def _san(host: str):
    from cryptography import x509

    host = str(host).strip()
    if not host:
        raise ValidationError("--host must not be empty")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.*")
    if not set(host) <= allowed or host.startswith(("-", ".")):
        raise ValidationError(f"--host {host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(host)


def write_certificates(out_dir: str | Path, hosts: Sequence[str], *, days: int = 365,
                       overwrite: bool = False, loopback: bool = False) -> dict[str, Path]:
    """Write a CA and a SuperLink certificate valid for ``hosts`` (DNS names or IPs).

    Returns the four paths by role (``ca_cert``, ``ca_key``, ``server_cert``,
    ``server_key``). The server certificate carries exactly ``hosts`` as subject
    alternative names (TLS clients check the address they dial against them),
    and the loopback names too when ``loopback`` is true.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValidationError("give at least one --host (the SuperLink's DNS name or IP address)")
    if int(days) < 1:
        raise ValidationError(f"days={days} must be >= 1")
    # the SuperLink's own SuperExec (which starts ServerApps) may dial it on the loopback
    # address over the same TLS: those names only when asked for
    names = list(dict.fromkeys([str(h).strip() for h in hosts]
                               + (list(_LOCAL_NAMES) if loopback else [])))
    sans = [_san(h) for h in names]
    out = Path(out_dir)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)  # clock skew
    until = now + _dt.timedelta(days=int(days))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedclust federation CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(hosts[0]))])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA384()))
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    return {
        "ca_cert": _write(out / CA_CERT, ca_cert.public_bytes(pem), private=False,
                          overwrite=overwrite),
        "ca_key": _write(out / CA_KEY, ca_key.private_bytes(pem, pkcs8, none), private=True,
                         overwrite=overwrite),
        "server_cert": _write(out / SERVER_CERT, cert.public_bytes(pem), private=False,
                              overwrite=overwrite),
        "server_key": _write(out / SERVER_KEY, key.private_bytes(pem, pkcs8, none), private=True,
                             overwrite=overwrite),
    }


def write_node_keys(out_dir: str | Path, n_nodes: int, *, overwrite: bool = False
                    ) -> dict[str, Path | list[Path]]:
    """Write ``n_nodes`` SuperNode key pairs and the public-key list.

    Returns ``{"private": [...], "public": [...], "csv": path}``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(n_nodes, bool) or int(n_nodes) != n_nodes or int(n_nodes) < 1:
        raise ValidationError(f"--nodes {n_nodes!r} must be an integer >= 1")
    out = Path(out_dir)
    private, public, lines = [], [], []
    for i in range(int(n_nodes)):
        key = ec.generate_private_key(ec.SECP384R1())
        priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                 serialization.NoEncryption())
        pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                            serialization.PublicFormat.OpenSSH)
        private.append(_write(out / f"node-{i}", priv, private=True, overwrite=overwrite))
        public.append(_write(out / f"node-{i}.pub", pub + f" fedclust-node-{i}\n".encode(),
                             private=False, overwrite=overwrite))
        lines.append(pub.decode("ascii"))
    csv = _write(out / PUBLIC_KEYS_CSV, (",".join(lines) + "\n").encode("ascii"), private=False,
                 overwrite=overwrite)
    return {"private": private, "public": public, "csv": csv}


def write_secagg_identities(out_dir: str | Path, device_ids: Sequence[int], *,
                            overwrite: bool = False) -> dict[str, Path | list[Path]]:
    """Ed25519 identity keys of secure aggregation's malicious-server variant.

    ``secagg-<z>.pem`` (private, for the SuperNode holding device ``z``: node
    config ``secagg-identity-key``) and :data:`SECAGG_DIRECTORY`, every device's
    public key (to every SuperNode, with ``ca.crt``: node config
    ``secagg-directory``; not secret, but it must not come from the server).
    """
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = Path(out_dir)
    private, directory = [], {}
    for z in sorted({int(v) for v in device_ids}):
        key = Ed25519PrivateKey.generate()
        private.append(_write(out / f"secagg-{z}.pem", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()), private=True, overwrite=overwrite))
        directory[str(z)] = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    path = _write(out / SECAGG_DIRECTORY, (json.dumps(directory, indent=1) + "\n").encode(),
                  private=False, overwrite=overwrite)
    return {"private": private, "directory": path}


def write_secagg_key(out_dir: str | Path, device_id: int, *, overwrite: bool = False
                     ) -> dict[str, Path]:
    """One node's own identity key, made on that node: ``secagg-<z>.pem`` (private,
    mode 0600, stays there) and ``secagg-<z>.pub.json`` (``{"device_id": z,
    "public": hex}``, the only part the node sends out)."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if isinstance(device_id, bool) or int(device_id) != device_id or int(device_id) < 0:
        raise ValidationError(f"--device-id {device_id!r} must be an integer >= 0")
    z = int(device_id)
    out = Path(out_dir)
    key = Ed25519PrivateKey.generate()
    private = _write(out / f"secagg-{z}.pem", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()), private=True, overwrite=overwrite)
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw).hex()
    public = _write(out / f"secagg-{z}.pub.json",
                    (json.dumps({"device_id": z, "public": pub}) + "\n").encode(),
                    private=False, overwrite=overwrite)
    return {"private": private, "public": public}


def write_secagg_directory(out_path: str | Path, public_files: Sequence[str | Path], *,
                           overwrite: bool = False) -> Path:
    """The directory (:data:`SECAGG_DIRECTORY` format) from the nodes' public halves
    (:func:`write_secagg_key`); one key per device id, each a 32-byte Ed25519 key."""
    import json

    directory: dict[str, str] = {}
    for f in public_files:
        try:
            entry = json.loads(Path(f).read_text())
            z, pub = int(entry["device_id"]), str(entry["public"])
            raw = bytes.fromhex(pub)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValidationError(f"{f}: not a secure-aggregation public key file ({exc})"
                                  ) from None
        if len(raw) != 32:
            raise ValidationError(f"{f}: public key of {len(raw)} bytes, an Ed25519 key has 32")
        if str(z) in directory and directory[str(z)] != pub:
            raise ValidationError(f"{f}: a second, different key for device {z}")
        directory[str(z)] = pub
    if not directory:
        raise ValidationError("no public key files given")
    return _write(Path(out_path), (json.dumps(directory, indent=1) + "\n").encode(),
                  private=False, overwrite=overwrite)


def load_secagg_identity(key_path: str | Path, directory_path: str | Path):
    """A :class:`fedclust.core.secure_sum.DeviceIdentity` from the two files above."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..core.secure_sum import DeviceIdentity

    try:
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
        table = json.loads(Path(directory_path).read_text())
        directory = {int(z): bytes.fromhex(pk) for z, pk in table.items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ValidationError(f"secure aggregation identity {key_path} / {directory_path}: "
                              f"cannot be read ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValidationError(f"{key_path}: not an Ed25519 private key")
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    return DeviceIdentity(raw, directory)
