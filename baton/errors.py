"""Domain exceptions (docs/design.md §8): one root per concern, named by condition, carrying data.

Callers branch on the class and its attributes, never on ``str(exc)``. The gRPC mapping of
every class lives in one table, :mod:`baton.grpc_errors`.
"""
from __future__ import annotations

import traceback
from typing import Any, Literal

ClaimRefusal = Literal["unknown", "terminal", "cancel_requested", "held", "starting"]
AttachRefusal = Literal["unknown-run", "terminal-run", "journal-timeout", "journal-stalled"]


class BatonError(Exception):
    """Root of every baton error."""


class InvalidArgument(BatonError):
    """A caller sent a value that can never be valid.

    Attributes:
        field: the request field at fault (e.g. ``"run_id"``).
        problem: what is wrong with it, for humans.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class StoreUnavailable(BatonError):
    """The coordination store (etcd) or the coordinator could not be reached in time."""


class StoreRefused(StoreUnavailable):
    """etcd answered a request with an error other than "unreachable" or "too slow".

    For example ``RESOURCE_EXHAUSTED`` (a response over gRPC's receive limit, or etcd's
    space quota), ``OUT_OF_RANGE`` (a revision compacted meanwhile), ``INVALID_ARGUMENT``.
    A kind of :class:`StoreUnavailable`, so every caller that retries or reports an
    unreachable store handles it too; the message names the etcd status.

    Attributes:
        code: the gRPC status name etcd answered (``"RESOURCE_EXHAUSTED"``).
        details: etcd's message.
    """

    def __init__(self, code: str, details: str) -> None:
        self.code = code
        self.details = details
        super().__init__(f"etcd refused the request ({code}): {details or 'no details'}")


class DurableRunIdRequired(BatonError):
    """A durable run was requested without a run id."""

    def __init__(self) -> None:
        super().__init__(
            "a runId is required: send it as an X-Run-Id header or a ?runId query param"
        )


class UnknownRun(BatonError):
    """No record exists for ``run_id``."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}")


class ThreadExists(BatonError):
    """A new thread (a fork's) was asked for under an id that is taken: the thread has runs,
    a transcript or a workspace already."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"thread {thread_id!r} exists already")


class ThreadBusy(BatonError):
    """The thread already has an active run (at most one per thread, docs/design.md §3.1)."""

    def __init__(self, thread_id: str, active_run_id: str) -> None:
        self.thread_id = thread_id
        self.active_run_id = active_run_id
        super().__init__(f"thread {thread_id!r} already has an active run {active_run_id!r}")


class UnknownThread(BatonError):
    """No thread of the caller's tenant has this id: another tenant's thread looks unknown.

    A thread belongs to the tenant of its first run; a run of another tenant on it is
    refused with this, never with :class:`ThreadBusy` (which would disclose the run id).
    """

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"unknown thread {thread_id!r}")


class RunIdRetired(BatonError):
    """Retention deleted the record of a run with this id, and the id cannot start a new run
    yet: the old run's delivery log may still hold its chunks and fences, which a new run of
    the same id would mix with its own (docs/design.md §3.5). Use a fresh run id.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run id {run_id!r} belonged to a run whose record was deleted; use a new run id")


# --- inputs to a live run (docs/hitl.md) --------------------------------------------------


class ApprovalNotFound(BatonError):
    """No approval ``approval_id`` of run ``run_id`` for the caller (another tenant's looks
    the same)."""

    def __init__(self, run_id: str, approval_id: str) -> None:
        self.run_id = run_id
        self.approval_id = approval_id
        super().__init__(f"run {run_id!r} has no approval {approval_id!r}")


class ApprovalAlreadyAnswered(BatonError):
    """The approval was answered already (or expired, which is a denial): the first answer
    stands. ``approval`` is the stored approval as the API's JSON object text."""

    def __init__(self, run_id: str, approval_id: str, approval: str) -> None:
        self.run_id = run_id
        self.approval_id = approval_id
        self.approval = approval
        super().__init__(f"approval {approval_id!r} of run {run_id!r} was answered already")


class RunEnded(BatonError):
    """The run has ended: it takes no more input."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} has ended")


class SteerUnsupported(BatonError):
    """The run's agent cannot take a message while it runs (its kind has no live input)."""

    def __init__(self, run_id: str, agent: str) -> None:
        self.run_id = run_id
        self.agent = agent
        super().__init__(f"run {run_id!r} ({agent}) cannot take a message while it runs")


class InputIdTaken(BatonError):
    """A message's id is an approval's of the same run (approvals and messages share one id
    space: the inbox passes each id once)."""

    def __init__(self, run_id: str, input_id: str) -> None:
        self.run_id = run_id
        self.input_id = input_id
        super().__init__(f"input id {input_id!r} of run {run_id!r} is taken by another input")


class QueueFull(BatonError):
    """The thread's queue holds as many runs as it may (``limit``, ``MAX_QUEUED_RUNS``)."""

    def __init__(self, thread_id: str, limit: int) -> None:
        self.thread_id = thread_id
        self.limit = limit
        super().__init__(f"thread {thread_id!r} has {limit} queued runs already, the most it may hold")


class QueuedRunStarted(BatonError):
    """A cancel of a queued run that has started already (its queue's dispatcher got there
    first): nothing was removed; the run is cancelled like any run (``POST /api/chat/cancel``)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"queued run {run_id!r} has started already")


class TooManyInputs(BatonError):
    """The run holds as many inputs as it may (``limit``)."""

    def __init__(self, run_id: str, limit: int) -> None:
        self.run_id = run_id
        self.limit = limit
        super().__init__(f"run {run_id!r} has {limit} inputs already, the most it may hold")


# --- claims and fencing -------------------------------------------------------------------


class ClaimError(BatonError):
    """Root of claim/ownership failures."""


class RunClaimNotAcquired(ClaimError):
    """``ClaimRun`` was refused.

    Attributes:
        run_id: the run.
        reason: ``unknown`` | ``terminal`` | ``cancel_requested`` | ``held`` |
            ``starting`` (its input is not durable yet: only its ``StartRun`` drives it).
    """

    def __init__(self, run_id: str, reason: ClaimRefusal) -> None:
        self.run_id = run_id
        self.reason: ClaimRefusal = reason
        super().__init__(f"claim on run {run_id!r} not acquired: {reason}")


class RunClaimLost(ClaimError):
    """The writer's claim was superseded; it must stop and never write again.

    Attributes:
        run_id: the run.
        held_epoch: the epoch this writer held.
        observed: what was seen instead (e.g. ``"fence@3"``, ``"close@2"``, ``"claim-gone"``).
    """

    def __init__(self, run_id: str, held_epoch: int, observed: str) -> None:
        self.run_id = run_id
        self.held_epoch = held_epoch
        self.observed = observed
        super().__init__(f"claim on run {run_id!r} at epoch {held_epoch} lost: {observed}")


class SessionLost(ClaimError):
    """The session's lease expired or was revoked."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} lost")


# --- delivery log -------------------------------------------------------------------------


class DeliveryLogError(BatonError):
    """Root of delivery-log failures."""


class AppendConflict(DeliveryLogError):
    """The log head moved under the writer, but not to a higher epoch's fence/close.

    The caller re-aligns and retries; nothing was lost or doubled.

    Attributes:
        run_id: the run.
        expected: the head sequence the writer expected.
        actual: the head sequence found.
        landed: offsets of the batch's chunks that were stored before the conflict (a
            prefix of the batch; nothing after the failed chunk landed).
    """

    def __init__(self, run_id: str, expected: int, actual: int, landed: tuple[str, ...] = ()) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        self.landed = landed
        super().__init__(f"log head of run {run_id!r} moved: expected {expected}, found {actual}")


class OffsetExpired(DeliveryLogError):
    """The requested offset is older than what retention kept.

    Attributes:
        run_id: the run.
        offset: the offset asked for.
        earliest_offset: the earliest offset still stored.
    """

    def __init__(self, run_id: str, offset: str, earliest_offset: str) -> None:
        self.run_id = run_id
        self.offset = offset
        self.earliest_offset = earliest_offset
        super().__init__(
            f"offset {offset} of run {run_id!r} is older than retention; earliest is {earliest_offset}"
        )


class InvalidOffset(DeliveryLogError):
    """An offset that is not ``-1``, ``now`` or a decimal sequence."""

    def __init__(self, offset: str) -> None:
        self.offset = offset
        super().__init__(f"invalid offset {offset!r}: use -1, now, or an id from the stream")


# --- journals, replay and alignment -------------------------------------------------------


class JournalError(BatonError):
    """Root of journal failures."""


class JournalAttachUnavailable(JournalError):
    """Attach preflight failed.

    Attributes:
        run_id: the run.
        reason: ``unknown-run`` | ``terminal-run`` | ``journal-timeout`` | ``journal-stalled``.
    """

    def __init__(self, run_id: str, reason: AttachRefusal) -> None:
        self.run_id = run_id
        self.reason: AttachRefusal = reason
        super().__init__(f"cannot attach to run {run_id!r}: {reason}")


class JournalReplayDiverged(JournalError):
    """The replayed journal does not match the stored log (docs/design.md §5.4).

    Attributes:
        index: position among journal-origin chunks where they differ.
        stored: the stored chunk's fingerprint (or ``None`` when the replay has more).
        replayed: the replayed chunk's fingerprint (or ``None`` when the replay ended early).
    """

    def __init__(self, index: int, stored: Any, replayed: Any) -> None:
        self.index = index
        self.stored = stored
        self.replayed = replayed
        super().__init__(f"journal replay diverged at index {index}")


class JournalReplayThreadIdMismatch(JournalReplayDiverged):
    """The replay differs from the stored log only in its thread id."""


# --- sandboxes ----------------------------------------------------------------------------


class SandboxError(BatonError):
    """Root of sandbox/provider failures."""


class SandboxBuildFailed(SandboxError):
    """Building a sandbox failed (e.g. a setup command exited non-zero).

    Attributes:
        step: which step failed.
        detail: redacted stderr tail.
    """

    def __init__(self, step: str, detail: str) -> None:
        self.step = step
        self.detail = detail
        super().__init__(f"sandbox build failed at {step}: {detail}")


class SandboxReclaimFailed(SandboxError):
    """A sandbox could not be found or destroyed from this host."""

    def __init__(self, sandbox_key: str, detail: str) -> None:
        self.sandbox_key = sandbox_key
        self.detail = detail
        super().__init__(f"sandbox {sandbox_key!r} could not be reclaimed: {detail}")


class ProviderUnreachable(SandboxError):
    """This host cannot reach the sandbox provider a run's sandbox is on (it cannot build a
    client with that provider's settings: no kubeconfig, no Docker engine…), so it refused to
    take the run over; another host may take it.

    Attributes:
        run_id: the run.
        provider: the provider its sandbox handle names.
        detail: why this host cannot reach it (no secret: the provider's own error, cut).
    """

    def __init__(self, run_id: str, provider: str, detail: str) -> None:
        self.run_id = run_id
        self.provider = provider
        self.detail = detail
        super().__init__(f"run {run_id!r}: this host cannot reach its sandbox provider {provider!r}: {detail}")


class HostDraining(BatonError):
    """The host is draining and takes no new runs."""


class HostAtCapacity(BatonError):
    """The host already drives ``capacity`` runs (``BATON_HOST_CAPACITY``) and takes no more.

    Another host may take the run; callers that pick hosts try the next one.
    """

    def __init__(self, host_id: str, capacity: int) -> None:
        self.host_id = host_id
        self.capacity = capacity
        super().__init__(f"host {host_id!r} is at capacity ({capacity} runs)")


class LogAlreadyClosed(DeliveryLogError):
    """The delivery log already ends with a ``close`` record (of this or a lower epoch).

    A successor that meets it finalizes the record from the close record instead of driving.

    Attributes:
        run_id: the run.
        status: the final status the close record carries.
        epoch: the epoch that wrote the close.
        offset: the close record's stream sequence.
    """

    def __init__(self, run_id: str, status: str, epoch: int, offset: int) -> None:
        self.run_id = run_id
        self.status = status
        self.epoch = epoch
        self.offset = offset
        super().__init__(f"delivery log of run {run_id!r} already closed ({status}) at epoch {epoch}")


class LogUnavailable(DeliveryLogError):
    """JetStream did not answer a delivery-log or transcript operation in time.

    Attributes:
        run_id: the run (or thread, for transcripts) concerned.
        detail: what failed, for humans (never contains payloads or secrets).
        landed: from ``LogWriter.append``: the offsets of the batch's prefix that was
            stored before the failure (a retry sends only the rest).
    """

    landed: tuple[str, ...] = ()

    def __init__(self, run_id: str, detail: str) -> None:
        self.run_id = run_id
        self.detail = detail
        super().__init__(f"delivery log unavailable for {run_id!r}: {detail}")


class LogStorageFull(LogUnavailable):
    """JetStream answers but does not store: its file store is full.

    Two ways nats-server shows it (checked against nats-server 2.15, docs/operating-nats.md):
    a refusal with JetStream error 10023 ``insufficient resources`` (or 10047) when the
    server's ``max_file_store`` is reached; or, when the disk itself filled first
    (ENOSPC), publishes to the stream go unanswered while reads still answer, until
    nats-server is restarted with free space. Writers keep their claim and retry; nothing
    unacknowledged was stored.

    Attributes:
        run_id: the run (or the stream, for a probe) concerned.
        detail: what failed, for humans.
        err_code: the JetStream error code of a refusal, or ``None`` when publishes went
            unanswered while JetStream answered reads.
    """

    def __init__(self, run_id: str, detail: str, err_code: int | None = None) -> None:
        self.run_id = run_id
        self.detail = detail
        self.err_code = err_code
        DeliveryLogError.__init__(self, f"delivery log cannot store for {run_id!r} (JetStream storage full?): {detail}")


class TranscriptFenced(DeliveryLogError):
    """A transcript save was refused by the transcript fence: the saved transcript was
    written by a successor of this run (a higher epoch) or by a later run of the thread.
    The writer must never save this run's transcript again (docs/design.md §4.2).

    Attributes:
        thread_id: the thread.
        run_id: the refused writer's run.
        epoch: the refused writer's epoch.
        stored_run_id: the run that saved the transcript now stored.
        stored_epoch: the epoch that saved it.
    """

    def __init__(self, thread_id: str, run_id: str, epoch: int, stored_run_id: str, stored_epoch: int) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.epoch = epoch
        self.stored_run_id = stored_run_id
        self.stored_epoch = stored_epoch
        super().__init__(
            f"transcript of thread {thread_id!r} not saved by run {run_id!r} at epoch {epoch}: "
            f"run {stored_run_id!r} at epoch {stored_epoch} saved it"
        )


class TranscriptConflict(DeliveryLogError):
    """A transcript save lost a compare-on-revision race.

    Attributes:
        thread_id: the thread.
        expected_revision: the revision the caller based its save on (``None`` = absent).
    """

    def __init__(self, thread_id: str, expected_revision: int | None) -> None:
        self.thread_id = thread_id
        self.expected_revision = expected_revision
        super().__init__(
            f"transcript of thread {thread_id!r} changed since revision {expected_revision}"
        )


# --- workspaces (a thread's snapshotted sandbox tree) ---------------------------------------


class WorkspaceError(BatonError):
    """Root of workspace snapshot/restore failures (docs/design.md "Workspaces")."""


class WorkspaceTooLarge(WorkspaceError):
    """A workspace holds more file content than ``BATON_WORKSPACE_MAX_BYTES``: nothing of it
    was stored (no snapshot references anything written for it).

    Attributes:
        limit: the limit in bytes of file content.
        size: the content seen when the limit was passed, in bytes (a lower bound of the
            tree's size: reading stops there).
    """

    def __init__(self, limit: int, size: int) -> None:
        self.limit = limit
        self.size = size
        super().__init__(f"workspace holds more than {limit} bytes of file content (at least {size})")


class WorkspaceUnsafe(WorkspaceError):
    """A workspace archive or snapshot holds an entry that could write outside its tree: an
    absolute path, a ``..`` component, an entry under a symlink, or an unknown entry type.
    Nothing is written for it.

    Attributes:
        path: the entry's path as found (never its content).
        problem: what is wrong with it, for humans.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"unsafe workspace entry {path!r}: {problem}")


class SnapshotMissing(WorkspaceError):
    """A snapshot cannot be restored: its manifest or one of its packs is gone (deleted by
    retention) or does not match its content digest.

    Attributes:
        digest: the snapshot's digest.
        detail: which object, for humans.
    """

    def __init__(self, digest: str, detail: str) -> None:
        self.digest = digest
        self.detail = detail
        super().__init__(f"snapshot {digest!r} cannot be restored: {detail}")


class WorkspaceFenced(TranscriptFenced):
    """A thread head save was refused by the transcript fence (a successor of this run, or a
    later run of the thread, saved the head): never save this run's turn again. A kind of
    :class:`TranscriptFenced`, with the same attributes."""

    def __init__(self, thread_id: str, run_id: str, epoch: int, stored_run_id: str, stored_epoch: int) -> None:
        super().__init__(thread_id, run_id, epoch, stored_run_id, stored_epoch)
        DeliveryLogError.__init__(
            self,
            f"workspace head of thread {thread_id!r} not saved by run {run_id!r} at epoch {epoch}: "
            f"run {stored_run_id!r} at epoch {stored_epoch} saved it",
        )


class WorkspaceConflict(TranscriptConflict):
    """A thread head save lost a compare-on-revision race more times than it retries, or a
    fork's new thread already has a head. A kind of :class:`TranscriptConflict`."""

    def __init__(self, thread_id: str, expected_revision: int | None) -> None:
        super().__init__(thread_id, expected_revision)
        DeliveryLogError.__init__(
            self, f"workspace head of thread {thread_id!r} changed since revision {expected_revision}"
        )


def drop_frames(exc: BaseException) -> None:
    """Clear the local variables of every finished frame ``exc`` and the exceptions it
    chains (``__cause__``, ``__context__``) passed through; frames still running are left.

    A failed call's exception sits in reference cycles (asyncio's task holds it, its
    traceback holds the task's frames, a frame holds the task) that only a collection frees,
    and its frames hold the request: a start whose 768 KB of messages the host refused kept
    them until then. Called where an error is mapped to its answer (gRPC servers' handlers,
    the gRPC client's error, the gateway's HTTP error handler), so the cycle that is left
    holds no request. The traceback itself (file, line, function) stays for logging.
    """
    seen: set[int] = set()
    pending = [exc]
    while pending:
        chain = pending.pop()
        if id(chain) in seen or len(seen) >= 32:
            continue
        seen.add(id(chain))
        traceback.clear_frames(chain.__traceback__)
        pending += [c for c in (chain.__cause__, chain.__context__) if c is not None]
