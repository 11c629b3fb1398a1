"""A host builds a provider it was not started with on first use (a takeover of a run whose
sandbox is on it), keeps it, and says clearly when it cannot (``ProviderUnreachable``), not
trying again at every ask (``HostDeps.provider_named``)."""
from __future__ import annotations

from typing import Any

import pytest

from baton.errors import ProviderUnreachable
from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.providers import Provider

pytestmark = pytest.mark.unit


def _deps(factory: Any, providers: dict[str, Any] | None = None) -> HostDeps:
    none: Any = None
    return HostDeps(host_id="h", cc=none, session=none, log=none, transcripts=none, providers=providers or {},
                    settings=HostSettings(provider="local"), provider_factory=factory)


async def test_a_provider_is_built_once_then_kept() -> None:
    built: list[str] = []
    own, other = object(), object()

    def factory(name: str) -> Provider:
        built.append(name)
        made: Any = other
        return made  # type: ignore[no-any-return]

    deps = _deps(factory, {"local": own})
    assert await deps.provider_named("local") is own
    assert await deps.provider_named("kubernetes", "r1") is other
    assert await deps.provider_named("kubernetes", "r2") is other
    assert built == ["kubernetes"]


async def test_a_provider_that_cannot_be_built_is_refused_clearly_and_not_retried_at_once() -> None:
    calls: list[str] = []

    def factory(name: str) -> Provider:
        calls.append(name)
        raise FileNotFoundError("/etc/kube/config: no such file")

    deps = _deps(factory)
    for run in ("r1", "r2"):
        with pytest.raises(ProviderUnreachable) as refused:
            await deps.provider_named("kubernetes", run)
        assert (refused.value.run_id, refused.value.provider) == (run, "kubernetes")
        assert refused.value.detail == "FileNotFoundError: /etc/kube/config: no such file"
    assert calls == ["kubernetes"]
