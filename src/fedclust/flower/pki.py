"""TLS certificates and SuperNode authentication keys for a Flower deployment.

``fedclust flower certs DIR --host NAME_OR_IP ...`` writes, with the
``cryptography`` library (no openssl needed):

* ``ca.crt`` / ``ca.key`` — a self-signed certificate authority (ECDSA P-384).
  ``ca.crt`` goes to every SuperNode (``--root-certificates ca.crt``) and to
  every machine that runs ``flwr`` (``root-certificates`` of the SuperLink
  connection); ``ca.key`` stays offline with whoever signs certificates;
* ``server.pem`` / ``server.key`` — the SuperLink's certificate, signed by the
  CA, with every given host name / IP address as a subject alternative name
  (plus ``127.0.0.1``, ``::1`` and ``localhost``: the SuperLink's own SuperExec,
  which starts the ServerApp, connects to it over loopback with the same TLS),
  for ``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem
  --ssl-keyfile server.key``.

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

__all__ = ["write_certificates", "write_node_keys", "write_secagg_identities",
           "load_secagg_identity", "CA_CERT", "CA_KEY", "SERVER_CERT", "SERVER_KEY",
           "PUBLIC_KEYS_CSV", "SECAGG_DIRECTORY"]

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
PUBLIC_KEYS_CSV = "public-keys.csv"
SECAGG_DIRECTORY = "secagg-identities.json"
_LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


def _write(path: Path, data: bytes, *, private: bool, overwrite: bool) -> Path:
    if path.exists() and not overwrite:
        raise ValidationError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600 if private else 0o644)
    return path


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
                       overwrite: bool = False) -> dict[str, Path]:
    """Write a CA and a SuperLink certificate valid for ``hosts`` (DNS names or IPs).

    Returns the four paths by role (``ca_cert``, ``ca_key``, ``server_cert``,
    ``server_key``). The server certificate carries every host as a subject
    alternative name (TLS clients check the address they dial against them).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValidationError("give at least one --host (the SuperLink's DNS name or IP address)")
    if int(days) < 1:
        raise ValidationError(f"days={days} must be >= 1")
    # the SuperLink's own SuperExec (which starts ServerApps) dials it on the loopback
    # address over the same TLS: without these names it fails its handshake
    names = list(dict.fromkeys([str(h).strip() for h in hosts] + list(_LOCAL_NAMES)))
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
