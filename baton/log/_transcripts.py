"""Transcripts: a thread's messages in a JetStream KV bucket (docs/design.md §4.2).

Key = an injective, key-safe encoding of the thread id. The value is
``{"writer": {"run", "epoch", "at"}, "messages": [...]}`` (values saved before the
transcript fence are a bare JSON list and stay readable). A save with a writer is fenced
(:mod:`baton.log._transcript_fence`): it reads the stored value's writer, refuses to
replace a successor's or a later run's transcript, and writes with compare-and-set on the
revision it read. A value larger than what the bucket (or the server's max
payload) accepts is split: its parts go under ``<key>.<generation>.<i>`` first, then the
key gets a small manifest ``{"parts": n, "gen": ..., "bytes": ..., "sha256": ..., "writer": ...}``
written with the same compare-on-revision as a plain value. Parts of one save never
overwrite another save's parts (fresh generation), so a lost race cannot corrupt the
winner's transcript; the loser's parts and a replaced manifest's parts are deleted.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.kv import KeyValue

from baton.errors import LogUnavailable, TranscriptConflict, TranscriptFenced
from baton.ids import encode_token
from baton.log._config import LogConfig
from baton.log._transcript_fence import TranscriptWriter, verdict

# Room left in a part for the publish's headers and JSON framing.
_HEADROOM = 1024
_NATS_ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError)


def thread_key(thread_id: str) -> str:
    """Injective KV key of a thread: ``%XX`` escapes of :func:`baton.ids.encode_token` with
    ``=`` for ``%`` (KV keys allow ``[-/_=.a-zA-Z0-9]``). Never contains ``.``, so a
    thread's key cannot collide with another thread's part keys."""
    return encode_token(thread_id).replace("%", "=")


class TranscriptStore:
    """Loads and saves transcripts with compare-on-revision.

    Args:
        nc: a connected NATS client.
        cfg: the bucket name and replicas (``cfg.bucket``, ``cfg.replicas``).
        max_value_size: bucket value limit in bytes used when this store creates the
            bucket (-1 = the server's max payload).
    """

    def __init__(self, nc: NATS, cfg: LogConfig | None = None, *, max_value_size: int = -1) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._cfg = cfg or LogConfig.from_env()
        self._max_value_size = max_value_size
        self._kv: KeyValue | None = None
        self._part_size: int | None = None

    async def provision(self) -> None:
        """Create the bucket if missing (idempotent)."""
        try:
            await self._js.key_value(self._cfg.bucket)
            return
        except nats.js.errors.BucketNotFoundError:
            pass
        await self._js.create_key_value(
            api.KeyValueConfig(
                bucket=self._cfg.bucket,
                history=1,
                storage=api.StorageType.FILE,
                replicas=self._cfg.replicas,
                max_value_size=self._max_value_size,
            )
        )

    async def _bucket(self) -> tuple[KeyValue, int]:
        if self._kv is None or self._part_size is None:
            try:
                kv = await self._js.key_value(self._cfg.bucket)
            except nats.js.errors.BucketNotFoundError:
                await self.provision()
                kv = await self._js.key_value(self._cfg.bucket)
            status = await kv.status()
            limit = self._nc.max_payload
            bucket_limit = status.stream_info.config.max_msg_size
            if bucket_limit is not None and bucket_limit > 0:
                limit = min(limit, bucket_limit)
            self._part_size = max(limit - _HEADROOM, 64)
            self._kv = kv
        return self._kv, self._part_size

    async def load(self, thread_id: str) -> tuple[list[dict[str, Any]], int | None]:
        """The thread's saved messages and the revision to compare on.

        Returns:
            ``(messages, revision)``; ``([], None)`` when nothing is saved.

        Raises:
            LogUnavailable: JetStream did not answer, or a part is missing/corrupt.
        """
        key = thread_key(thread_id)
        try:
            kv, _ = await self._bucket()
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return [], None
            value, _writer = _decode(entry.value or b"")
            if isinstance(value, dict):
                chunks = [(await kv.get(f"{key}.{value['gen']}.{i}")).value or b"" for i in range(int(value["parts"]))]
                blob = b"".join(chunks)
                if hashlib.sha256(blob).hexdigest() != value.get("sha256"):
                    raise LogUnavailable(thread_id, "transcript parts do not match their manifest")
                value = json.loads(blob)
            return list(value), entry.revision
        except _NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"loading the transcript failed: {type(exc).__name__}") from exc

    async def save(
        self, thread_id: str, messages: list[dict[str, Any]], expected_revision: int | None = None,
        *, writer: TranscriptWriter | None = None,
    ) -> int:
        """Save the thread's messages if the saved revision is still ``expected_revision``.

        Args:
            thread_id: the thread.
            messages: AG-UI messages (JSON-serialisable dicts).
            expected_revision: the revision :meth:`load` returned; ``None`` (or 0) means
                "nothing saved yet" (create).
            writer: who saves (run, epoch, run start). When given, the save is fenced: it
                is refused if the stored value was saved by this run at a higher epoch or by
                a later run of the thread, and the writer is stored with the value.

        Returns:
            The new revision.

        Raises:
            TranscriptFenced: the stored transcript is a successor's or a later run's;
                never save this run's transcript again.
            TranscriptConflict: someone saved in between; load again and retry.
            LogUnavailable: JetStream did not answer.
        """
        key = thread_key(thread_id)
        body = json.dumps(messages, separators=(",", ":"), ensure_ascii=False)
        stamp = json.dumps(writer.to_json(), separators=(",", ":")) if writer is not None else None
        blob = body.encode("utf-8")
        try:
            kv, part_size = await self._bucket()
            current = await self._current(kv, key) if expected_revision or writer is not None else None
            if writer is not None and current is not None:
                rev_now, stored_value, stored_writer = current
                if expected_revision and rev_now != expected_revision:
                    # The fence is judged on the value the compare-and-set replaces.
                    raise TranscriptConflict(thread_id, expected_revision)
                if not expected_revision:
                    raise TranscriptConflict(thread_id, expected_revision)  # create, but it exists
                if verdict(stored_writer, writer) != "replace":
                    assert stored_writer is not None
                    raise TranscriptFenced(thread_id, writer.run_id, writer.epoch,
                                           stored_writer.run_id, stored_writer.epoch)
            old_manifest = current[1] if current is not None and isinstance(current[1], dict) else None
            parts: list[str] = []
            inline = blob if stamp is None else f'{{"writer":{stamp},"messages":{body}}}'.encode("utf-8")
            if len(inline) <= part_size:
                value = inline
            else:
                gen = uuid.uuid4().hex[:16]
                for i in range(0, len(blob), part_size):
                    part_key = f"{key}.{gen}.{len(parts)}"
                    await kv.put(part_key, blob[i : i + part_size])
                    parts.append(part_key)
                manifest: dict[str, Any] = {"parts": len(parts), "gen": gen, "bytes": len(blob),
                                            "sha256": hashlib.sha256(blob).hexdigest()}
                if writer is not None:
                    manifest["writer"] = writer.to_json()
                value = json.dumps(manifest).encode()
            try:
                if expected_revision:
                    rev = await kv.update(key, value, last=expected_revision)
                else:
                    rev = await kv.create(key, value)
            except nats.js.errors.KeyWrongLastSequenceError as exc:
                await self._delete(kv, parts)
                raise TranscriptConflict(thread_id, expected_revision) from exc
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code in (10071, 10164):
                    await self._delete(kv, parts)
                    raise TranscriptConflict(thread_id, expected_revision) from exc
                raise
            if old_manifest is not None:
                await self._delete(
                    kv, [f"{key}.{old_manifest['gen']}.{i}" for i in range(int(old_manifest["parts"]))]
                )
            return int(rev)
        except _NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"saving the transcript failed: {type(exc).__name__}") from exc

    async def delete(self, thread_id: str) -> None:
        """Delete the thread's transcript (its parts too). Idempotent.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        key = thread_key(thread_id)
        try:
            kv, _ = await self._bucket()
            current = await self._current(kv, key)
            if current is None:
                return
            value = current[1]
            await kv.purge(key)
            if isinstance(value, dict) and "gen" in value:
                await self._delete(kv, [f"{key}.{value['gen']}.{i}" for i in range(int(value.get("parts") or 0))])
        except _NATS_ERRORS as exc:
            raise LogUnavailable(thread_id, f"deleting the transcript failed: {type(exc).__name__}") from exc

    @staticmethod
    async def _current(kv: KeyValue, key: str) -> tuple[int, Any, TranscriptWriter | None] | None:
        """The stored entry: ``(revision, messages list or manifest dict, writer)``, or ``None``."""
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        value, writer = _decode(entry.value or b"")
        return int(entry.revision or 0), value, writer

    @staticmethod
    async def _delete(kv: KeyValue, keys: list[str]) -> None:
        # Best effort: a leftover part is garbage, never a wrong transcript.
        for k in keys:
            with contextlib.suppress(*_NATS_ERRORS):
                await kv.purge(k)


def _decode(raw: bytes) -> tuple[Any, TranscriptWriter | None]:
    """A stored value → (messages list, or a parts manifest dict; its writer or ``None``).

    Three shapes are readable: a bare list (saved without a writer), ``{"writer",
    "messages"}``, and a parts manifest (``{"parts", "gen", ...}``, with or without writer).
    """
    value = json.loads(raw) if raw else []
    if isinstance(value, dict):
        writer = TranscriptWriter.from_json(value.get("writer"))
        if "parts" in value:
            return value, writer
        return list(value.get("messages") or []), writer
    return value, None
