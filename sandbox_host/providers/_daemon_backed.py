"""What a provider whose sandboxes run the sandbox daemon (docker, kubernetes) answers through
that daemon alone: a file's size, the agent's process group (signal, liveness) and the
daemon's TLS certificate (docs/design.md, "The sandbox daemon").

A mixin placed before :class:`~sandbox_host.providers._base.Provider` in a provider's bases;
the provider gives the handle's client (``_daemon``) and its sandbox CA (``_ca``).
"""
from __future__ import annotations

from sandbox_host.providers import _sandbox_tls
from sandbox_host.providers._base import SandboxHandle
from sandbox_host.providers._daemon_client import DaemonClient


class DaemonBacked:
    """The daemon-answered calls of :class:`~sandbox_host.providers._base.Provider`."""

    _ca: _sandbox_tls.SandboxCa | None

    def _daemon(self, handle: SandboxHandle) -> DaemonClient:
        raise NotImplementedError

    @staticmethod
    def _pgid(handle: SandboxHandle) -> int | None:
        """The agent's process group the launch recorded on the handle, if any."""
        pgid = handle.data.get("pgid")
        return int(pgid) if pgid else None

    async def file_size(self, handle: SandboxHandle, path: str) -> int | None:
        """Size in bytes; ``None`` when the file (or the sandbox) does not exist."""
        return await self._daemon(handle).file_size(path)

    async def kill(self, handle: SandboxHandle, signal: int) -> bool:
        """Signal the agent's process group; ``False`` when nothing was signalled or the
        sandbox is gone."""
        return await self._daemon(handle).kill(self._pgid(handle), signal)

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        """Whether the agent's process group has a member (``False`` once the sandbox is gone)."""
        return await self._daemon(handle).processes_alive(self._pgid(handle))

    def cert_check_every(self) -> float | None:
        """See :meth:`Provider.cert_check_every` (with a sandbox CA: a sixth of its TTL)."""
        return _sandbox_tls.check_every(self._ca.ttl) if self._ca is not None else None

    async def renew_tls(self, handle: SandboxHandle) -> float | None:
        """See :meth:`Provider.renew_tls` (a certificate minted by the sandbox CA, through the daemon)."""
        if self._ca is None or not handle.data.get("daemon_tls"):
            return None
        return await _sandbox_tls.renew_if_due(self._daemon(handle), self._ca, handle.key)
