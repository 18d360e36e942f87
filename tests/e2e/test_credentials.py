"""Credentials rotated without a restart: the token file and TLS files read again on SIGHUP or
when polling sees them change, applied whole or not at all, each reload audited."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import time
from pathlib import Path

import pytest
from cgsvc_client.client import Client
from cryptography import x509

from cgsvc.errors import ServiceError
from cgsvc.server.auth import hash_token
from cgsvc.server.credentials import RELOAD_METHOD
from cgsvc.v1 import audit_pb2
from tests.e2e.certs import ThrowawayPKI
from tests.e2e.server import ServerProcess

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4}, "parallelism": {"tp": 4}}
ADMIN = "tok-admin-rot-1"


def write_tokens(path: Path, principals: dict[str, tuple[str, list[str]]]) -> str:
    """principal -> (token, roles), plus the admin these tests read the audit log with."""
    lines = []
    for name, (token, roles) in {"ops": (ADMIN, ["admin"]), **principals}.items():
        lines += ["[[tokens]]", f'principal = "{name}"', f"roles = {roles!r}".replace("'", '"'),
                  f'sha256 = "{hash_token(token)}"', ""]
    path.write_text("\n".join(lines))
    return str(path)


def reloads(srv: ServerProcess, count: int, timeout: float = 20.0, **tls: str) -> list[audit_pb2.AuditRecord]:
    """The server's credential-reload records, once there are `count` of them."""
    deadline = time.monotonic() + timeout
    with Client(srv.address, token=ADMIN, **tls) as admin:
        while True:
            records = list(admin.list_audit_records(filter=f'method = "{RELOAD_METHOD}"').records)
            if len(records) >= count or time.monotonic() > deadline:
                return records
            time.sleep(0.1)


def resolves(srv: ServerProcess, token: str, **tls: str) -> str:
    """"OK", or the code the server refused the call with."""
    with Client(srv.address, token=token, timeout=5, **tls) as c:
        try:
            c.resolve(KIMI)
        except ServiceError as exc:
            return exc.code
    return "OK"


def test_sighup_rotates_tokens_audits_it_and_keeps_the_old_set_when_the_new_file_is_bad(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    write_tokens(tf, {"alice": ("tok-alice", ["resolver"]), "carol": ("tok-carol", ["auditor"])})
    with ServerProcess(tmp_path / "srv", "--token-file", str(tf)) as srv:
        assert any(line.startswith(f"credentials: SIGHUP reloads {tf}") for line in srv.output)
        assert resolves(srv, "tok-alice") == "OK" and resolves(srv, "tok-bob") == "UNAUTHENTICATED"
        assert resolves(srv, "tok-carol") == "PERMISSION_DENIED"

        write_tokens(tf, {"bob": ("tok-bob", ["resolver"]), "carol": ("tok-carol-2", ["resolver", "auditor"])})
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGHUP)
        [record] = reloads(srv, 1)
        assert record.principal == "cgsvc" and record.outcome_code == 0
        assert record.outcome_message == (
            "reloaded on SIGHUP: added token principal 'bob' (resolver); removed token principal 'alice' (had "
            "resolver); token principal 'carol': roles auditor -> auditor, resolver; token principal 'carol': "
            "token replaced")
        assert resolves(srv, "tok-alice") == "UNAUTHENTICATED"
        assert resolves(srv, "tok-bob") == "OK" and resolves(srv, "tok-carol-2") == "OK"
        assert resolves(srv, "tok-carol") == "UNAUTHENTICATED"

        # a token pasted where its hash belongs: refused whole, the set in use stays, and it says so
        tf.write_text(tf.read_text().replace(hash_token("tok-bob"), "tok-bob" * 9 + "x"))
        srv.proc.send_signal(signal.SIGHUP)
        refused = reloads(srv, 2)[1]
        assert refused.outcome_code == 3  # INVALID_ARGUMENT
        assert "refused, the credentials in use stay: token_file" in refused.outcome_message
        assert "tokens[1].sha256" in refused.outcome_message
        assert resolves(srv, "tok-bob") == "OK" and srv.alive()
        with Client(srv.address, token=ADMIN) as admin:
            assert admin.verify_audit_log().ok
        assert 'cgsvc_credential_reloads_total{outcome="refused"} 1.0' in srv.metrics_text()
        assert 'cgsvc_credential_reloads_total{outcome="applied"} 1.0' in srv.metrics_text()


def test_a_changed_file_is_reloaded_without_a_signal_when_polling(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    write_tokens(tf, {"alice": ("tok-alice", ["resolver"])})
    with ServerProcess(tmp_path / "srv", "--token-file", str(tf), "--credentials-poll-seconds", "0.2") as srv:
        time.sleep(0.6)
        assert reloads(srv, 0) == []  # nothing changed: nothing reloaded
        write_tokens(tf, {"alice": ("tok-alice", ["resolver"]), "dave": ("tok-dave", [])})
        [record] = reloads(srv, 1)
        assert record.outcome_message == ("reloaded: a credential file changed: added token principal "
                                          "'dave' (no roles)")
        assert resolves(srv, "tok-dave") == "PERMISSION_DENIED"
        tf.write_text(tf.read_text() + "expires = 2999-01-01T00:00:00Z\n")  # dave's entry is the last
        assert reloads(srv, 2)[1].outcome_message == ("reloaded: a credential file changed: token principal 'dave': "
                                                      "expires never -> 2999-01-01T00:00:00+00:00")
        tf.write_text(tf.read_text() + "\n")  # a change to the file, none to what it admits
        assert reloads(srv, 3)[2].outcome_message == "reloaded: a credential file changed: no change"
        time.sleep(0.6)
        assert len(reloads(srv, 3)) == 3  # looked at again, unchanged: no fourth reload


def _served_serial(port: int, ca: str) -> int:
    """The serial number of the certificate a new TLS connection to the server is shown."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _expiry(path: str) -> float:
    return x509.load_pem_x509_certificate(Path(path).read_bytes()).not_valid_after_utc.timestamp()


def _cert_expiry_metric(srv: ServerProcess) -> float:
    name = 'cgsvc_tls_certificate_expiry_timestamp_seconds{setting="tls_cert"} '
    return float(next(line for line in srv.metrics_text().splitlines() if line.startswith(name)).split()[-1])


def _serial(path: str) -> int:
    return x509.load_pem_x509_certificate(Path(path).read_bytes()).serial_number


def test_sighup_serves_a_renewed_certificate_to_new_connections_and_refuses_a_mismatched_pair(tmp_path: Path) -> None:
    pki = ThrowawayPKI(tmp_path)
    old_cert, old_key = pki.issue("old", "localhost", server=True, days=2)
    new_cert, new_key = pki.issue("new", "localhost", server=True)
    cert, key = str(tmp_path / "served.crt"), str(tmp_path / "served.key")
    shutil.copy(old_cert, cert)
    shutil.copy(old_key, key)
    tf = write_tokens(tmp_path / "tokens.toml", {})
    with ServerProcess(tmp_path / "srv", "--tls-cert", cert, "--tls-key", key, "--token-file", tf) as srv:
        assert _served_serial(srv.port, pki.ca_path) == _serial(old_cert)
        # the old certificate expires in two days: the start says so, and the metric says when
        assert any(line.startswith("WARNING: tls_cert: the certificate expires at ") for line in srv.output)
        assert _cert_expiry_metric(srv) == _expiry(old_cert)
        with Client(srv.address, token=ADMIN, tls_ca=pki.ca_path) as kept:  # a connection open across the reload
            kept.echo(b"before")
            shutil.copy(new_cert, cert)
            shutil.copy(new_key, key)
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGHUP)
            [record] = reloads(srv, 1, tls_ca=pki.ca_path)
            assert record.outcome_code == 0
            assert record.outcome_message.startswith("reloaded on SIGHUP: tls_cert: 'localhost' (SHA-256 ")
            assert _served_serial(srv.port, pki.ca_path) == _serial(new_cert)
            assert kept.echo(b"after") == b"after"
            assert _cert_expiry_metric(srv) == _expiry(new_cert)

            shutil.copy(old_cert, cert)  # the old certificate with the new key: not a pair
            srv.proc.send_signal(signal.SIGHUP)
            refused = reloads(srv, 2, tls_ca=pki.ca_path)[1]
            assert refused.outcome_code == 3
            assert "tls_key: not the key of tls_cert's certificate" in refused.outcome_message
            assert _served_serial(srv.port, pki.ca_path) == _serial(new_cert)
            with Client(srv.address, token=ADMIN, tls_ca=pki.ca_path) as fresh:
                assert fresh.echo(b"new connection") == b"new connection"


def test_credentials_poll_seconds_must_not_be_negative(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "srv", "--credentials-poll-seconds", "-1")
    with pytest.raises(RuntimeError, match="credentials_poll_seconds must be 0"):
        srv.start()
