"""Deployment hygiene: certificates and SuperNode keys Flower accepts, exit codes of failed runs."""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import sys
import textwrap

import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from fedclust.cli import main  # noqa: E402
from fedclust.flower.pki import write_certificates, write_node_keys  # noqa: E402
from fedclust.flower.runner import DeploymentError, flwr_run  # noqa: E402


def test_certificates_chain_and_sans(tmp_path):
    paths = write_certificates(tmp_path, ["10.0.0.5", "superlink.example.org"], loopback=True)
    ca = x509.load_pem_x509_certificate(paths["ca_cert"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["server_cert"].read_bytes())
    # signed by the CA (raises InvalidSignature otherwise)
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                           ec.ECDSA(cert.signature_hash_algorithm))
    assert cert.issuer == ca.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address(a) for a in ("10.0.0.5", "127.0.0.1", "::1")]
    assert san.get_values_for_type(x509.DNSName) == ["superlink.example.org", "localhost"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in ("ca_key", "server_key"):
        assert stat.S_IMODE(os.stat(paths[key]).st_mode) == 0o600
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA384)


def test_flower_loads_the_certificates(tmp_path):
    """Flower's own server-certificate loader accepts them (what flower-superlink calls)."""
    from types import SimpleNamespace

    from flwr.common.args import try_obtain_server_certificates

    p = write_certificates(tmp_path, ["127.0.0.1"])
    args = SimpleNamespace(insecure=False, ssl_certfile=str(p["server_cert"]),
                           ssl_keyfile=str(p["server_key"]), ssl_ca_certfile=str(p["ca_cert"]))
    certs = try_obtain_server_certificates(args)
    assert certs is not None and certs[0] == p["ca_cert"].read_bytes()


def test_node_keys_in_flowers_format(tmp_path):
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    out = write_node_keys(tmp_path, 3)
    lines = out["csv"].read_text().strip().split(",")
    assert len(lines) == 3
    for priv, pub, line in zip(out["private"], out["public"], lines):
        key = load_ssh_private_key(priv.read_bytes(), None)   # what flower-supernode does
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
        assert try_load_public_key(pub)                     # what `flwr supernode register` does
        assert pub.read_text().startswith(line)
    assert len(set(lines)) == 3


def test_refuses_to_overwrite_and_bad_hosts(tmp_path, capsys):
    write_node_keys(tmp_path, 1)
    assert main(["flower", "keys", str(tmp_path), "--nodes", "1"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["flower", "certs", str(tmp_path / "c"), "--host", "bad host!"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'bad host!'" in err


def _fake_flwr(tmp_path, status: str, details: str, started: bool = True):
    """A stand-in for the `flwr` CLI that prints what Flower 1.42 prints."""
    script = tmp_path / "flwr"
    start = 'print("Successfully started run 42")' if started else \
        'print("Error: connection to the SuperLink is unavailable"); sys.exit(1)'
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        if sys.argv[1] == "run":
            {start}
            print("INFO :      some streamed log line")
        elif sys.argv[1] == "ls":
            assert "--run-id" in sys.argv and "42" in sys.argv
            print(json.dumps({{"success": True, "runs": [{{"run-id": "42", "status": {status!r},
                               "status-details": {details!r}}}]}}))
        """))
    script.chmod(0o755)
    return str(script)


def test_flwr_run_exit_follows_the_run_status(tmp_path, capsys):
    ok = _fake_flwr(tmp_path, "finished:completed", "")
    assert flwr_run(tmp_path, "tls", flwr=ok) == 42
    bad = _fake_flwr(tmp_path, "finished:failed",
                     "ServerApp failed with exception: round 0: none of the 3 devices\nreplied")
    with pytest.raises(DeploymentError, match=r"run 42 finished:failed: ServerApp failed .* "
                                              r"none of the 3 devices replied$"):
        flwr_run(tmp_path, "tls", flwr=bad)
    nostart = _fake_flwr(tmp_path, "", "", started=False)
    with pytest.raises(DeploymentError, match="started no run .*connection to the SuperLink"):
        flwr_run(tmp_path, flwr=nostart)


def test_cli_flower_run_failure_is_one_line_and_nonzero(tmp_path, capsys, monkeypatch):
    _fake_flwr(tmp_path, "finished:failed", "ServerApp failed with exception: no SuperNode")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["flower", "run", str(tmp_path), "tls"]) == 1
    err = capsys.readouterr().err
    assert err == "fedclust: error: run 42 finished:failed: ServerApp failed with exception: " \
                  "no SuperNode\n"


def test_server_app_failure_logs_the_cause_first(tmp_path, caplog):
    """The ServerApp's first error line is the cause; Flower then marks the run failed."""
    from fedclust.flower.apps import ServerAppFailed, ServerSpec, make_client_app, make_server_app
    from fedclust.flower.grid import LocalGrid, run_server_app
    from fedclust.kfed.protocol import KFedProtocol

    spec = ServerSpec.for_protocol(KFedProtocol(2, 2), 0, min_nodes=2, node_wait_s=0.0,
                                   round_timeout_s=None, result_dir=str(tmp_path))
    grid = LocalGrid(make_client_app(), [{}, {}])  # nodes without data: every device fails
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        with pytest.raises(ServerAppFailed) as info:
            run_server_app(make_server_app(spec), grid)
    finally:
        flwr_logger.removeHandler(caplog.handler)
    cause = str(info.value)
    assert "\n" not in cause and "has no data" in cause
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[0] == f"fedclust: error: {cause}"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_cli_unexpected_error_is_one_line(monkeypatch, capsys):
    import fedclust.cli as cli

    def boom(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "_execute", boom)
    monkeypatch.delenv("FEDCLUST_DEBUG", raising=False)
    assert main(["demo"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ZeroDivisionError: division by zero" in err
