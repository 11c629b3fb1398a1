"""A sandbox as a driver holds it: provider, handle and the journal's sentinel nonce."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox_host.providers import Provider, SandboxHandle


@dataclass
class Sandbox:
    """One sandbox of a run (built by this host or re-opened from the registry).

    Attributes:
        provider: the provider that built it.
        handle: the provider's handle (paths, container id, ...).
        nonce: the journal sentinel's nonce (``""`` when the registry had none).
        destroyed: set once the sandbox is confirmed gone.
    """

    provider: "Provider"
    handle: "SandboxHandle"
    nonce: str
    destroyed: bool = False
