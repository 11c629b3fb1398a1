"""Cancel intents: a user's Stop of a run id that has no record yet (docs/design.md §3.1).

A client that mints run ids (TanStack does) can send its Stop before its POST landed. The
intent (tenant + reason, :func:`coordinator.rules.cancel_intent_value`) is stored under
``cancel-intents/<run>/<tenant>`` (one per tenant: another tenant's cancel of the same id
neither replaces nor stops it) on a lease of :data:`~coordinator.rules.CANCEL_INTENT_TTL`
seconds, written only while the run key is absent; the run's create transaction reads and
compares the intent key (:func:`on_create`), so either the cancel lands on the record or
the start sees the intent. Kept apart from :mod:`coordinator._store`, which applies it.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from baton.errors import StoreUnavailable
from baton.retry import Deadline
from baton.v1.runs_pb2 import RunRecord
from coordinator import _etcd as E
from coordinator import rules
from coordinator._keys import Keys



class _Store(Protocol):
    """What :func:`user_cancel` needs of :class:`coordinator._store.RunStore` (no import cycle)."""

    keys: Keys
    etcd: Any

    async def mutate(self, run_id: str, decide: Callable[[rules.Snapshot], rules.Plan[Any]], *,
                     timeout: float) -> Any: ...


def on_create(keys: Keys, new: RunRecord, intent: E.KV | None, cmps: list[E.Cmp]) -> list[E.Op]:
    """Make a run being created born cancelled when its own tenant cancelled its id first.

    Appends the compare on the intent key to ``cmps`` (an intent written concurrently makes
    the create retry) and returns the ops to add: the intent's deletion when it applied.
    ``new`` gets ``cancel_requested`` and the intent's reason then.
    """
    key = keys.cancel_intent(new.run_id, new.tenant)
    cmps.append(E.cmp_mod(key, intent.mod_revision if intent else 0))
    reason = rules.born_cancelled(intent.value if intent else None, new.tenant)
    if reason is None:
        return []
    new.cancel_requested = True
    new.cancel_reason = reason
    return [E.delete(key)]


async def user_cancel(store: _Store, run_id: str, reason: str, tenant: str, *, timeout: float) -> RunRecord | None:
    """A user's cancel: the store's ``request_cancel`` of a run of ``tenant``, or, for a run
    id with no record yet, a cancel intent the run's start will find.

    Returns:
        The record (cancel requested), or ``None`` when an intent was recorded.

    Raises:
        UnknownRun: the run is another tenant's.
        StoreUnavailable: etcd did not answer within ``timeout`` seconds.
    """
    deadline = Deadline.after(timeout)

    def left() -> float:
        if deadline.expired:
            raise StoreUnavailable("deadline exceeded before etcd answered")
        return deadline.left()

    run_key, intent_key = store.keys.run(run_id), store.keys.cancel_intent(run_id, tenant)
    while True:
        r = await store.etcd.txn([], [E.get(run_key, count_only=True)], timeout=left())
        if r.count(0):
            out: RunRecord | None = await store.mutate(
                run_id, lambda snap: rules.cancel_for_tenant(snap, reason=reason, tenant=tenant),
                timeout=left())
            assert out is not None
            return out
        lease_id, _ = await store.etcd.grant(rules.CANCEL_INTENT_TTL, timeout=left())
        res = await store.etcd.txn([E.cmp_absent(run_key)],
                                   [E.put(intent_key, rules.cancel_intent_value(tenant, reason), lease_id)],
                                   timeout=left())
        if res.succeeded:
            return None
        # The run was created meanwhile: cancel its record (the unused lease expires).
