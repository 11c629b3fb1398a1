"""A local sandbox's daemon over TLS with a sandbox CA (``BATON_SANDBOX_CA_*``): the host
starting it mints its certificate, every host checks it against the CA, and a host whose
CA differs is refused clearly."""
from __future__ import annotations

import os
import pathlib

import pytest

from sandbox_host.journal import new_nonce
from sandbox_host.providers import SandboxSpec
from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._daemon_client import DaemonUnreachable
from sandbox_host.providers._local_daemon import meta_dir
from sandbox_host.providers.local import LocalProvider
from tests.conftest import assert_eventually
from tests.sandbox.conftest import with_data
from tests.tls.pki import CA

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


@pytest.mark.parametrize("internal_tls", [False, True])
async def test_a_local_daemon_serves_its_own_certificate(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                         internal_tls: bool) -> None:
    ours, theirs = CA(tmp_path / "ours", "ours"), CA(tmp_path / "theirs", "theirs")
    monkeypatch.setenv(_sandbox_tls.CA_CERT, ours.cert)
    monkeypatch.setenv(_sandbox_tls.CA_KEY, ours.key)
    if internal_tls:  # the host's own certificate must not be what the daemon serves
        leaf = ours.leaf("host")
        monkeypatch.setenv("BATON_TLS_CERT", leaf.cert)
        monkeypatch.setenv("BATON_TLS_KEY", leaf.key)
        monkeypatch.setenv("BATON_TLS_CA", ours.cert)
    host = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
    h = await host.create("tls-run", SandboxSpec())
    try:
        launched = await host.launch(h, ["sh", "-c", "echo over-tls"], nonce=new_nonce())
        h = with_data(h, launched)
        meta = pathlib.Path(meta_dir(h))
        assert (meta / "daemon-tls.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
        assert oct(os.stat(meta / "daemon-tls.key").st_mode & 0o777) == "0o600"

        async def ended() -> bool:
            return b"over-tls" in await host.read_file(h, h.journal_path)
        await assert_eventually(ended, timeout=30)
        # A host with another sandbox CA is refused in the handshake, with a clear error.
        other_ca = _sandbox_tls.from_env({_sandbox_tls.CA_CERT: theirs.cert, _sandbox_tls.CA_KEY: theirs.key})
        other = LocalProvider(str(tmp_path / "sandboxes"), str(tmp_path / "journals"), idle_check=0.05, sandbox_io="daemon")
        other._daemons._ca = other_ca
        try:
            with pytest.raises(OSError) as err:
                await other._client(h).read_file(h.journal_path)
            assert isinstance(err.value, DaemonUnreachable) and "certificate" in str(err.value)
            assert "PRIVATE KEY" not in str(err.value)
        finally:
            await other.close()
    finally:
        await host.destroy(h)
        await host.close()
