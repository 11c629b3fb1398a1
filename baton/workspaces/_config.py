"""Names and limits of the workspace store (docs/design.md "Workspaces")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from baton import config
from baton.workspaces.paths import Excludes


@dataclass(frozen=True)
class WorkspaceConfig:
    """Where snapshots and thread heads live, and what a snapshot may hold.

    Attributes:
        objects: the Object Store bucket of manifests and packs.
        heads: the KV bucket of thread heads.
        replicas: JetStream replicas of both buckets.
        max_bytes: bytes of file content a snapshot may hold.
        excludes: paths never snapshotted.
        idle_ttl: seconds a head is kept after its last save (0 = forever): the KV
            bucket's max age, so every save starts it again.
        pack_bytes: a pack is sealed past this many bytes (restore gets packs in parallel).
        max_packs: packs a snapshot names at most before older ones are rewritten.
        max_turns: turn records a head keeps.
        timeout: seconds one JetStream operation (one object put or get, one KV call) may take.
        parallel: object puts/gets in flight at once.
        chunk_bytes: Object Store chunk size of a put (one JetStream message each; nats-py's
            default is 128 KiB, fewer larger chunks put and get faster).
    """

    objects: str = "baton-workspaces"
    heads: str = "baton-sessions"
    replicas: int = 1
    max_bytes: int = 1 << 30
    excludes: Excludes = field(default_factory=lambda: Excludes(("home/.claude/.credentials.json", "home/.codex/auth.json")))
    idle_ttl: float = 30 * 24 * 3600.0
    pack_bytes: int = 16 << 20
    max_packs: int = 8
    max_turns: int = 100
    timeout: float = 30.0
    parallel: int = 4
    chunk_bytes: int = 1 << 20

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WorkspaceConfig":
        """Read ``BATON_WORKSPACE_OBJECTS``, ``_HEADS``, ``_REPLICAS`` (empty: ``BATON_LOG_REPLICAS``),
        ``_MAX_BYTES``, ``_EXCLUDES`` and ``_IDLE_TTL``.

        Raises:
            ValueError: naming the variable when a number does not parse.
        """
        replicas_raw = config.get("BATON_WORKSPACE_REPLICAS", env) or config.get("BATON_LOG_REPLICAS", env)
        max_raw = config.get("BATON_WORKSPACE_MAX_BYTES", env)
        try:
            replicas = int(replicas_raw)
        except ValueError:
            raise ValueError(f"BATON_WORKSPACE_REPLICAS must be an integer, got {replicas_raw!r}") from None
        try:
            max_bytes = int(max_raw)
        except ValueError:
            raise ValueError(f"BATON_WORKSPACE_MAX_BYTES must be an integer, got {max_raw!r}") from None
        return cls(
            objects=config.get("BATON_WORKSPACE_OBJECTS", env),
            heads=config.get("BATON_WORKSPACE_HEADS", env),
            replicas=replicas,
            max_bytes=max_bytes,
            excludes=Excludes.parse(config.get("BATON_WORKSPACE_EXCLUDES", env)),
            idle_ttl=config.get_float("BATON_WORKSPACE_IDLE_TTL", env),
        )
