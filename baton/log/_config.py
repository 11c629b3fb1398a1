"""Names and limits of the delivery-log stream and the transcripts bucket (docs/design.md §4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from baton import config
from baton.ids import subject_token
from baton.log.snapshot import SnapshotPolicy


def _count(name: str, env: Mapping[str, str] | None) -> int:
    raw = config.get(name, env)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _positive(name: str, env: Mapping[str, str] | None) -> int:
    value = _count(name, env)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


@dataclass(frozen=True)
class LogConfig:
    """Where delivery logs and transcripts live in JetStream.

    Attributes:
        stream: the JetStream stream holding every run's delivery log.
        subject_prefix: run subjects are ``<subject_prefix>.<token>``; the stream binds
            ``<subject_prefix>.>``.
        bucket: the KV bucket holding transcripts.
        max_age: delivery-log retention in seconds (0 = unlimited).
        replicas: JetStream replicas of the stream and the bucket.
        max_msgs_per_subject: per-run record limit (-1 = unlimited); tests use a small
            value to make retention drop old records.
        snapshot_chunks: chunks after which a snapshot is due (baton.log.snapshot; 0: never by count).
        snapshot_bytes: bytes of chunk JSON after which a snapshot is due (0: never by size).
        snapshot_part_bytes: largest record a snapshot is stored in (under JetStream's
            ``max_payload``, 1 MiB by default); a larger snapshot is stored in parts.
        max_consumers: the most consumers the runs stream takes at once (its
            ``max_consumers``). Every read of a run's log is one (a gateway's shared tail of a
            run, a lingering one, a reader behind it); nats-server 2.15 gives a stream that
            names no limit 1,000, and a read past it waits until another ends.
    """

    stream: str = "BATON_RUNS"
    subject_prefix: str = "baton.runs"
    bucket: str = "baton-threads"
    max_age: float = 30 * 24 * 3600.0
    replicas: int = 1
    max_msgs_per_subject: int = -1
    snapshot_chunks: int = 5000
    snapshot_bytes: int = 1 << 20
    snapshot_part_bytes: int = 512 * 1024
    max_consumers: int = 100_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "LogConfig":
        """Read ``BATON_RUNS_STREAM``, ``BATON_SUBJECT_PREFIX``, ``BATON_THREADS_BUCKET``,
        ``BATON_LOG_MAX_AGE`` (seconds), ``BATON_LOG_REPLICAS``, ``BATON_SNAPSHOT_CHUNKS``,
        ``BATON_SNAPSHOT_BYTES`` and ``BATON_LOG_MAX_CONSUMERS``.

        Raises:
            ValueError: naming the variable when a number does not parse.
        """
        replicas_raw = config.get("BATON_LOG_REPLICAS", env)
        try:
            replicas = int(replicas_raw)
        except ValueError:
            raise ValueError(f"BATON_LOG_REPLICAS must be an integer, got {replicas_raw!r}") from None
        return cls(
            stream=config.get("BATON_RUNS_STREAM", env),
            subject_prefix=config.get("BATON_SUBJECT_PREFIX", env),
            bucket=config.get("BATON_THREADS_BUCKET", env),
            max_age=config.get_float("BATON_LOG_MAX_AGE", env),
            replicas=replicas,
            snapshot_chunks=_count("BATON_SNAPSHOT_CHUNKS", env),
            snapshot_bytes=_count("BATON_SNAPSHOT_BYTES", env),
            max_consumers=_positive("BATON_LOG_MAX_CONSUMERS", env),
        )

    def subject(self, run_id: str) -> str:
        """The run's subject: ``<subject_prefix>.<injective token of run_id>``."""
        return f"{self.subject_prefix}.{subject_token(run_id)}"

    @property
    def snapshot_policy(self) -> SnapshotPolicy:
        """When a run's log gets a snapshot."""
        return SnapshotPolicy(self.snapshot_chunks, self.snapshot_bytes)

    @property
    def subjects_wildcard(self) -> str:
        """The stream's subject filter."""
        return f"{self.subject_prefix}.>"
