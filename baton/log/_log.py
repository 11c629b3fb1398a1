"""The delivery log: provisioning, writers, readers and headers-only reads (docs/design.md §4.1)."""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any, Awaitable, Callable

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import api

from baton.errors import LogStorageFull, LogUnavailable
from baton.ids import subject_token
from baton.log import _headers as H
from baton.log._api import (
    ERR_STREAM_NAME_IN_USE, STORAGE_FULL_CODES, RawRecord, direct_batch, first_on_subject, last_on_subject,
)
from baton.log._config import LogConfig
from baton.log._consumer import OrderedConsumer
from baton.log._nats_auth import connect_options
from baton.log._reader import LogReader, parse_offset
from baton.log._replies import Replies
from baton.log._transcripts import TranscriptStore
from baton.log._writer import LogWriter, WriteObserver

log = logging.getLogger("baton.log")
# How long a storage probe record is kept (nats-server per-message TTL).
_PROBE_TTL = "60s"
#: About how many bytes (headers and bodies) a successor's first read of the stored log
#: takes in one direct get; a longer log's rest is read headers-only (stored_before_fence).
DIRECT_READ_BYTES = 1 << 20
# What a dropped or refused connection raises (an outage, not a bug worth a traceback).
_CONNECTION_ERRORS = (OSError, asyncio.TimeoutError, nats.errors.NoServersError, nats.errors.UnexpectedEOF,
                      nats.errors.StaleConnectionError, nats.errors.ConnectionClosedError)


class _ConnectionEvents:
    """NATS connection events as single log lines.

    nats-py's default logs every failed (re)connect attempt, 5 a second, with a full
    traceback; an outage is one warning here, one debug line per attempt and one info line
    when the connection is back. Messages name the exception, never the server URL (it may
    carry credentials).
    """

    def __init__(self, then: Callable[[], Awaitable[None]] | None = None) -> None:
        self.down = False
        self.nc: NATS | None = None  # set once connected
        self.then = then  # awaited after each reconnect

    async def error(self, exc: Exception) -> None:
        if isinstance(exc, _CONNECTION_ERRORS):
            if self.down:
                log.debug("NATS still unreachable: %s", type(exc).__name__)
            else:
                self.down = True
                log.warning("NATS unreachable (%s); reconnecting", type(exc).__name__)
            return
        log.warning("NATS error: %s: %s", type(exc).__name__, exc)

    async def disconnected(self) -> None:
        if self.nc is not None and self.nc.is_closed:
            return  # our own close, not an outage
        if not self.down:
            self.down = True
            log.warning("NATS connection lost; reconnecting")

    async def reconnected(self) -> None:
        self.down = False
        log.info("NATS reconnected")
        if self.then is not None:
            await self.then()


class DeliveryLog:
    """Client of the runs stream: one per process, shared by every writer and reader.

    Args:
        nc: a connected NATS client (the log does not close it unless it opened it).
        cfg: stream, subject prefix and bucket names, retention, replicas.
    """

    def __init__(self, nc: NATS, cfg: LogConfig | None = None, *, owns_connection: bool = False) -> None:
        self.nc = nc
        self.cfg = cfg or LogConfig.from_env()
        self.js = nc.jetstream()
        self._owns = owns_connection
        #: Every writer's publishes wait for their acks on the connection's one reply
        #: subscription.
        self._replies = Replies.of(nc)
        #: Told about every write of this log's writers (a host sets its metrics here).
        self.observer: WriteObserver | None = None
        # nats-py parses every message's headers in Python; its parser dominated the
        # headers-only read of a 100k-record log (the takeover budget is 2 s). The
        # replacement gives the same dict for well-formed headers. An instance attribute,
        # so only this connection is affected. A private method of nats-py:
        # tests/log/test_header_parser_swap.py fails when nats-py renames it, changes its
        # signature, stops calling it, or parses sample headers differently from this one.
        if hasattr(nc, "_parse_header_lines"):
            nc._parse_header_lines = H.fast_parse_header_lines  # type: ignore[method-assign]

    @classmethod
    async def connect(cls, nats_url: str | list[str], cfg: LogConfig | None = None, **options: Any) -> "DeliveryLog":
        """Connect to NATS and return a log that closes the connection on :meth:`close`.

        Args:
            nats_url: server URL(s) (``nats://host:port``, comma-separated allowed).
            cfg: names and limits; ``LogConfig.from_env()`` when omitted.
            options: passed to ``nats.connect`` (defaults: reconnect forever every 0.2 s, ping
                every 5 s, a server that leaves more than 2 unanswered is left; TLS, a .creds
                file or an nkey seed from ``BATON_NATS_*``: :mod:`baton.log._nats_auth`);
                besides, ``on_reconnected``: awaited after each reconnect (what was published
                on core NATS while the connection was down never reached its subscriptions).

        Raises:
            baton.tls.TlsConfigError: a ``BATON_NATS_*`` file is missing or unusable.
        """
        servers = nats_url.split(",") if isinstance(nats_url, str) else nats_url
        options.setdefault("max_reconnect_attempts", -1)
        options.setdefault("reconnect_time_wait", 0.2)
        options.setdefault("connect_timeout", 5)
        # A server that vanishes without closing the connection (a machine lost, a network
        # partition) is noticed once more than two pings go unanswered: in about 15 s, not
        # nats-py's default 6 minutes.
        # Then the client moves to another server of the list (docs/deploy.md).
        options.setdefault("ping_interval", 5)
        options.setdefault("max_outstanding_pings", 2)
        for name, value in connect_options().items():
            options.setdefault(name, value)
        events = _ConnectionEvents(options.pop("on_reconnected", None))
        options.setdefault("error_cb", events.error)
        options.setdefault("disconnected_cb", events.disconnected)
        options.setdefault("reconnected_cb", events.reconnected)
        nc = await nats.connect(servers=servers, **options)
        events.nc = nc
        if events.down:  # the first connect needed retries (no reconnected callback for it)
            await events.reconnected()
        log = cls(nc, cfg, owns_connection=True)
        await log._replies.start()
        return log

    async def close(self) -> None:
        """Close the NATS connection if this log opened it (a writer's publish still
        waiting for its ack gives up)."""
        if self._owns:
            await self._replies.close()
            if not self.nc.is_closed:
                await self.nc.close()

    async def __aenter__(self) -> "DeliveryLog":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stream_config(self) -> api.StreamConfig:
        """The runs stream's configuration (file storage, direct get, retention)."""
        return api.StreamConfig(
            name=self.cfg.stream,
            subjects=[self.cfg.subjects_wildcard],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            max_age=self.cfg.max_age or None,
            num_replicas=self.cfg.replicas,
            allow_direct=True,
            max_msgs_per_subject=self.cfg.max_msgs_per_subject,
            allow_msg_ttl=True,  # storage probes expire (probe_storage)
            # Set, not left to the server: nats-server 2.15 gives a stream with none 1,000
            # (and takes no "unlimited"), which 200 runs read through 5 gateways' tails reach.
            max_consumers=self.cfg.max_consumers,
        )

    async def provision(self) -> None:
        """Create (or update to the configured limits) the runs stream and the bucket, and
        subscribe to publish acks (else the first append does).

        Idempotent: safe to run from every service at start.

        Raises:
            LogUnavailable: JetStream refused or did not answer.
        """
        cfg = self.stream_config()
        try:
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != ERR_STREAM_NAME_IN_USE:
                    raise
                await self.js.update_stream(cfg)
            await TranscriptStore(self.nc, self.cfg).provision()
            await self._replies.start()
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(self.cfg.stream, f"provisioning failed: {exc}") from exc

    async def probe_storage(self, prober: str, *, timeout: float = 2.0) -> None:
        """Store one small probe record in the runs stream, to learn whether it stores.

        The probe lives at ``<subject_prefix>._probe.<prober>``: two tokens, so never a run's
        subject (those have one). It expires after a minute (``Nats-TTL``; the stream
        allows per-message TTLs), so probing leaves a few records at most. Not a purge of
        earlier probes: a purge against a store that just hit ENOSPC held up reads of the
        stream (seen with nats-server 2.15). A refusal-free probe of the runs stream itself is what
        tells a full store: nats-server still answers reads, compare failures and
        duplicates of a stream whose writes hit ENOSPC, and only real stores go unanswered.

        Each probe carries a nonce. When its acknowledgement does not come in time, the last
        record on the probe subject is read back: the probe there means it was stored and
        only the answer was late (this process's loop or the server starved of CPU), which
        is no storage problem; as a writer whose publish went unanswered finds its record
        by its message id (``LogWriter``).

        Args:
            prober: who probes (e.g. the gateway id).
            timeout: seconds to wait for the acknowledgement.

        Raises:
            LogStorageFull: refused for lack of storage, or unanswered while reads answer.
            LogUnavailable: JetStream does not answer at all (not even reads).
        """
        stream = self.cfg.stream
        subject = f"{self.cfg.subject_prefix}._probe.{subject_token(prober)}"
        nonce = secrets.token_hex(8).encode()
        try:
            reply = await self.nc.request(subject, nonce, timeout=timeout,
                                          headers={H.KIND: "probe", "Nats-TTL": _PROBE_TTL})
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
                asyncio.TimeoutError) as exc:
            try:
                last = await last_on_subject(self.nc, stream, subject, timeout=timeout)
            except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError):
                raise LogUnavailable(stream, f"JetStream does not answer: {type(exc).__name__}") from exc
            if last is not None and last.data == nonce:
                log.info("storage probe: stored, its acknowledgement later than %.1f s", timeout)
                return
            raise LogStorageFull(stream, "JetStream answers reads but did not acknowledge a store") from exc
        resp = json.loads(reply.data)
        err = resp.get("error")
        if err is not None:
            code = err.get("err_code")
            if code in STORAGE_FULL_CODES:
                raise LogStorageFull(stream, f"probe refused: {err.get('description', '')} ({code})", code)
            # Any other refusal (e.g. 10166 "per-message TTL is disabled" on a stream not yet
            # re-provisioned) says nothing about storage: JetStream answered, so no problem
            # is reported, and nobody is refused service on a guess.
            log.debug("storage probe refused: %s (%s)", err.get("description", ""), code)

    def writer(self, run_id: str, epoch: int, *, publish_timeout: float = 2.0) -> LogWriter:
        """A writer for ``run_id`` under the claim of ``epoch``; call ``fence()`` first."""
        return LogWriter(self.nc, self.js, self.cfg, run_id, epoch, publish_timeout=publish_timeout,
                         observer=self.observer, replies=self._replies)

    def read(
        self, run_id: str, after: str = "-1", *, stop_at_close: bool = True, idle_heartbeat: float = 1.0
    ) -> LogReader:
        """Read chunks strictly after ``after`` (``-1``, ``now`` or an offset).

        Returns a :class:`LogReader` (an async iterator of ``(offset, chunk)``); it ends
        after the close record. Use ``async with`` to remove its consumer promptly.

        Raises:
            InvalidOffset: at once, when ``after`` is not ``-1``, ``now`` or a decimal.
            OffsetExpired: on :meth:`LogReader.open` / first iteration, when ``after`` is
                older than the run's earliest stored record.
        """
        parse_offset(after)
        return LogReader(self.nc, self.cfg, run_id, after, stop_at_close=stop_at_close, idle_heartbeat=idle_heartbeat)

    async def compact(self, run_id: str, *, now: float, older_than: float) -> bool:
        """See :func:`baton.log._compact.compact` (a finished run's log to its final snapshot)."""
        from baton.log._compact import compact

        return await compact(self.nc, self.cfg, run_id, now=now, older_than=older_than)

    async def compact_outcome(self, run_id: str, *, now: float, older_than: float) -> str:
        """See :func:`baton.log._compact.compact_outcome` (what compaction did, or why not)."""
        from baton.log._compact import compact_outcome

        return await compact_outcome(self.nc, self.cfg, run_id, now=now, older_than=older_than)

    async def last_record(self, run_id: str) -> H.StoredRecord | None:
        """Headers of the run's last record (e.g. to see if the log is closed), or None.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        tail = await self._tail(run_id)
        return H.parse_record(tail.seq, tail.headers) if tail else None

    async def _tail(self, run_id: str) -> RawRecord | None:
        """The run's last stored record, raw. Raises ``LogUnavailable``."""
        try:
            return await last_on_subject(self.nc, self.cfg.stream, self.cfg.subject(run_id))
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(run_id, f"reading the log head failed: {type(exc).__name__}") from exc

    async def close_record(self, run_id: str) -> tuple[H.StoredRecord, float] | None:
        """The run's close record and when the run finished (Unix seconds: the close's
        ``Baton-Finished-At``, else when JetStream stored it), or ``None`` while the log is
        open (or empty).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        tail = await self._tail(run_id)
        if tail is None:
            return None
        rec = H.parse_record(tail.seq, tail.headers)
        if rec.kind != "close":
            return None
        try:
            finished_at = float(tail.headers.get(H.FINISHED_AT) or tail.stored_at)
        except ValueError:
            finished_at = tail.stored_at
        return rec, finished_at

    async def chunk_at(self, run_id: str, offset: int) -> Any:
        """The body of the run's chunk at ``offset``, or ``None`` when that offset holds no
        chunk of this run (another run's record, a fence or close, or nothing stored).

        One ``STREAM.MSG.GET`` (the first record of the run's subject at or after
        ``offset``), no consumer: a successor reads the run input this way while it takes
        the run over.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        try:
            rec = await first_on_subject(self.nc, self.cfg.stream, self.cfg.subject(run_id), start=int(offset))
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(run_id, f"reading a record failed: {type(exc).__name__}") from exc
        if rec is None or rec.seq != int(offset) or rec.headers.get(H.KIND, "chunk") != "chunk":
            return None
        return json.loads(rec.data)

    async def stored_headers(self, run_id: str, before: int | str | None = None) -> list[H.StoredRecord]:
        """Every record of the run (headers only, bodies not transferred), in order.

        Alignment reads this once, right after its fence landed (docs/design.md §5.4).

        Args:
            run_id: the run.
            before: only records with a smaller sequence (e.g. this claim's fence
                offset); ``None`` = everything stored when the call starts.

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        subject = self.cfg.subject(run_id)
        try:
            tail = await last_on_subject(self.nc, self.cfg.stream, subject)
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            raise LogUnavailable(run_id, f"reading the log head failed: {type(exc).__name__}") from exc
        if tail is None:
            return []
        last = tail.seq if before is None else min(tail.seq, int(before) - 1)
        return await self._headers_between(subject, 1, last)

    async def _headers_between(self, subject: str, first: int, last: int) -> list[H.StoredRecord]:
        """Headers of the subject's records with ``first <= seq <= last`` (an ordered,
        headers-only consumer: bodies are not transferred)."""
        out: list[H.StoredRecord] = []
        if last < max(first, 1):
            return out
        parse = H.parse_record
        async with OrderedConsumer(
            self.nc, self.cfg.stream, subject, first, headers_only=True,
            batch=4096,
        ) as consumer:
            while True:
                seq, pending, headers, _ = await consumer.next_raw()
                if seq > last:
                    break
                out.append(parse(seq, headers))
                if seq == last or pending == 0:
                    break
        return out

    async def stored_before_fence(self, run_id: str, fenced_over: int, *,
                                  max_bytes: int = DIRECT_READ_BYTES) -> tuple[list[H.StoredRecord], dict[int, bytes]]:
        """Every record stored before a fence, and the bodies of its chunks read directly.

        What a successor reads right after its fence (docs/design.md §5.4), in one batched
        direct get for a log of up to about ``max_bytes``: no consumer is created, which
        made this read most of a takeover's time. ``fenced_over`` is exactly the last
        record before the fence (its compare said so), so an answer that stops short of
        it (a longer log, or a replica lagging the leader) is told, and the rest is read
        with a headers-only consumer, as :meth:`stored_headers` does.

        Args:
            run_id: the run.
            fenced_over: :attr:`LogWriter.fenced_over` of the writer that fenced.
            max_bytes: about how much the direct read transfers (headers and bodies).

        Returns:
            (the records' headers in order, ``{offset: body}`` of the chunks among those
            read directly: every chunk's when the direct read took the whole log, the run
            input among them; none of those the consumer read).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        if fenced_over <= 0:
            return [], {}
        subject = self.cfg.subject(run_id)
        try:
            raw = await direct_batch(self.nc, self.cfg.stream, subject, up_to=fenced_over, max_bytes=max_bytes)
        except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            log.debug("run %s: direct read of the stored log failed (%s); reading it with a consumer",
                      run_id, type(exc).__name__)
            raw = []
        parse = H.parse_record
        records = [parse(r.seq, r.headers) for r in raw]
        bodies = {rec.offset: r.data for rec, r in zip(records, raw) if rec.kind == "chunk"}
        last = records[-1].offset if records else 0
        if last < fenced_over:
            try:
                records += await self._headers_between(subject, last + 1, fenced_over)
            except (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
                raise LogUnavailable(run_id, f"reading the stored log failed: {type(exc).__name__}") from exc
        return records, bodies


#: Seconds a service starting up waits for JetStream to take its provisioning (a cluster that
#: is electing stream leaders, or a loaded machine, answers late at first).
PROVISION_PATIENCE = 60.0


async def provision_with_patience(log: DeliveryLog, *stores: Any, patience: float = PROVISION_PATIENCE) -> None:
    """Provision the delivery log and ``stores`` (anything with an idempotent ``provision()``,
    e.g. a ``WorkspaceStore``), retrying while JetStream does not answer, for ``patience``
    seconds: a service started while NATS elects its leaders waits instead of exiting.

    Raises:
        LogUnavailable: still failing after ``patience`` seconds.
    """
    from baton.retry import Deadline, retry

    async def once() -> None:
        await log.provision()
        for s in stores:
            await s.provision()

    def note(exc: BaseException) -> None:
        logging.getLogger("baton.log").warning("provisioning JetStream failed (%s); trying again", exc)

    await retry(once, deadline=Deadline.after(patience), retry_on=(LogUnavailable,), max_pause=2.0, on_retry=note)
