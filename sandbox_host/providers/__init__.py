"""Sandbox providers (docs/design.md §5.1) behind one interface, :class:`Provider`.

``provider_for(name, **config)`` builds one by name. Providers are imported lazily, so a
host without the Docker SDK (or engine) can still run local sandboxes.
"""
from __future__ import annotations

import importlib
from typing import Any

from sandbox_host.providers._base import Chunk, Provider, Sandbox, SandboxHandle, SandboxSpec
from sandbox_host.providers._redact import REDACTED, redact

#: provider name -> "module:Class" (the docker provider registers itself here too).
PROVIDERS: dict[str, str] = {
    "local": "sandbox_host.providers.local:LocalProvider",
    "docker": "sandbox_host.providers.docker:DockerProvider",
    "kubernetes": "sandbox_host.providers.kubernetes:KubernetesProvider",
}


def provider_for(name: str, **config: Any) -> Provider:
    """A provider instance by name.

    Args:
        name: ``"local"``, ``"docker"`` or ``"kubernetes"``.
        **config: keyword arguments of the provider's constructor (e.g. ``base_dir``,
            ``journal_dir`` for local).

    Raises:
        ValueError: for an unknown provider name.
    """
    target = PROVIDERS.get(name)
    if target is None:
        raise ValueError(f"unknown sandbox provider {name!r}; known: {', '.join(sorted(PROVIDERS))}")
    module, cls = target.split(":")
    provider: Provider = getattr(importlib.import_module(module), cls)(**config)
    return provider


__all__ = ["PROVIDERS", "Chunk", "Provider", "REDACTED", "Sandbox", "SandboxHandle", "SandboxSpec", "provider_for", "redact"]
