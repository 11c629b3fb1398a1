"""The docker provider against an engine reached over mutual TLS, configured the Docker way
(``DOCKER_HOST=tcp://…``, ``DOCKER_TLS_VERIFY=1``, ``DOCKER_CERT_PATH`` holding ``ca.pem``,
``cert.pem``, ``key.pem``: the SDK's ``docker.from_env``).

The TLS endpoint is a TLS terminator of this test in front of the machine's engine socket
(the engine is shared: a second dockerd with ``--tlsverify`` would need its own data root,
network and images). It checks the client's certificate against the CA as ``dockerd
--tlsverify`` does, so the provider is shown to work through that configuration and a client
without a certificate is refused. docs/deploy.md "Docker engine over TLS" says how to run
dockerd itself with TLS.
"""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import ssl
from typing import AsyncIterator

import docker
import docker.errors
import pytest

from sandbox_host.journal import JournalExit, JournalLine, new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers.docker import DockerProvider
from tests.conftest import unique
from tests.docker.conftest import DOCKER_MARKS, follow_all, with_data
from tests.tls.pki import CA

pytestmark = [*DOCKER_MARKS, pytest.mark.timeout(120)]
ENGINE_SOCKET = "/var/run/docker.sock"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def tls_engine(ca: CA, server_cert: str, server_key: str) -> AsyncIterator[int]:
    """A mutual-TLS endpoint on loopback forwarding to the engine's socket; yields its port."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca.cert)
    ctx.load_cert_chain(server_cert, server_key)
    ctx.verify_mode = ssl.CERT_REQUIRED  # as dockerd --tlsverify
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            ur, uw = await asyncio.open_unix_connection(ENGINE_SOCKET)
            await asyncio.gather(_pipe(reader, uw), _pipe(ur, writer))
        except OSError:
            writer.close()
        finally:
            handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for t in list(handlers):
            t.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def test_provider_over_a_tls_engine(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = CA(tmp_path / "pki", "engine")
    server, client = ca.leaf("dockerd"), ca.leaf("baton-host")
    certs = tmp_path / "docker-certs"
    certs.mkdir()
    shutil.copy(ca.cert, certs / "ca.pem")
    shutil.copy(client.cert, certs / "cert.pem")
    shutil.copy(client.key, certs / "key.pem")
    async with tls_engine(ca, server.cert, server.key) as port:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
        monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
        monkeypatch.setenv("DOCKER_CERT_PATH", str(certs))
        provider = await asyncio.to_thread(DockerProvider)  # docker.from_env(): the variables above
        handle = None
        try:
            assert provider._api.base_url.startswith("https://")
            nonce = new_nonce()
            handle = await provider.create(unique("dk-tls-"), SandboxSpec(provider="docker"))
            handle = with_data(handle, await provider.launch(handle, ["sh", "-c", "echo '{\"tls\":1}'"], nonce=nonce))
            items = await follow_all(provider, handle, nonce)
            assert [it.data for it in items if isinstance(it, JournalLine)] == [b'{"tls":1}']
            assert isinstance(items[-1], JournalExit) and items[-1].code == 0
        finally:
            if handle is not None:
                assert await provider.destroy(handle) is True
            await provider.aclose()
        # Without a client certificate the engine is not reached at all.
        bare = docker.DockerClient(base_url=f"https://127.0.0.1:{port}", version="1.25",  # no call yet
                                   tls=docker.tls.TLSConfig(ca_cert=str(certs / "ca.pem"), verify=True))
        bare.api.trust_env = False
        try:
            with pytest.raises((docker.errors.DockerException, OSError)):
                await asyncio.to_thread(bare.ping)
        finally:
            bare.close()
