"""Names and limits of the delivery-log stream and the transcripts bucket (docs/design.md §4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from baton import config
from baton.ids import subject_token


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
    """

    stream: str = "BATON_RUNS"
    subject_prefix: str = "baton.runs"
    bucket: str = "baton-threads"
    max_age: float = 30 * 24 * 3600.0
    replicas: int = 1
    max_msgs_per_subject: int = -1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "LogConfig":
        """Read ``BATON_RUNS_STREAM``, ``BATON_SUBJECT_PREFIX``, ``BATON_THREADS_BUCKET``,
        ``BATON_LOG_MAX_AGE`` (seconds) and ``BATON_LOG_REPLICAS``.

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
        )

    def subject(self, run_id: str) -> str:
        """The run's subject: ``<subject_prefix>.<injective token of run_id>``."""
        return f"{self.subject_prefix}.{subject_token(run_id)}"

    @property
    def subjects_wildcard(self) -> str:
        """The stream's subject filter."""
        return f"{self.subject_prefix}.>"
