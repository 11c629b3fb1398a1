"""The stand-in Kubernetes API's object store: namespaced objects, resource versions, watch
events, label and field selectors, owner garbage collection and refusals on demand.

A **stand-in**, not Kubernetes: nothing here ran against a real API server. It keeps what the
``kubernetes`` provider and its tests rely on, with the API server's semantics:

- every write bumps one cluster-wide ``resourceVersion``; a watch from version ``v`` gets
  every later event of its kind (``410 Gone`` when ``v`` has left the history);
- a pod with a node (the kubelet stand-in took it) is deleted gracefully: the delete sets
  ``metadata.deletionTimestamp`` and the object stays until the kubelet has stopped its
  processes and calls :meth:`Store.remove` (as the real kubelet confirms a deletion);
- removing an object removes the objects whose ``ownerReferences`` name its uid (the
  garbage collector's background deletion);
- a JSON merge patch (``ownerReferences`` added to an object, say);
- :class:`Refusal` makes a verb fail with a ``Status`` (403 RBAC, 403 quota, 422, 409 …).
"""
from __future__ import annotations

import asyncio
import copy
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

#: Watch events kept for watches that resume from a resource version.
HISTORY = 10_000

Obj = dict[str, Any]


class ApiStatusError(Exception):
    """A request the API refuses, as a ``metav1.Status``: ``code`` (HTTP), ``reason``, ``message``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass
class Refusal:
    """Refuse ``verb`` on ``resource`` (``"pods"``, ``"sandboxes.agents.x-k8s.io"``; ``"*"``
    any) ``times`` times (``None`` = until cleared) with ``code``/``reason``/``message``."""

    verb: str
    resource: str
    code: int
    reason: str
    message: str
    times: int | None = None


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    resource: str
    namespace: str
    obj: Obj


@dataclass
class Store:
    """Objects by ``(resource, namespace, name)``; see the module docstring."""

    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    rv: int = 0
    history: list[Event] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    #: Resources whose deletion waits for :meth:`remove` (pods that a kubelet runs).
    graceful: set[str] = field(default_factory=lambda: {"pods"})
    #: Kinds this API serves beyond the core ones (``"sandboxes.agents.x-k8s.io"``: the CRD
    #: is installed).
    extra_resources: set[str] = field(default_factory=set)
    #: RBAC: resource → the verbs the caller may use (``None`` = everything). A verb not
    #: granted gets the API's 403, as for a ServiceAccount whose Role lacks it.
    allowed: dict[str, set[str]] | None = None
    _changed: asyncio.Event | None = None

    def changed(self) -> asyncio.Event:
        """An event set at the next write (then replaced by a fresh one). Take it, check
        ``rv``, then wait on it: a write in between has set it already. An event, not a
        Condition: a ``wait_for`` timeout cancelling ``Condition.wait`` while it re-acquires
        the lock leaves the lock released under ``async with`` (Python 3.11), whose exit
        then raises."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    # --- refusals -------------------------------------------------------------------------

    def check(self, verb: str, resource: str) -> None:
        """Raise a 403 for a verb :attr:`allowed` does not grant, else the first matching
        :class:`Refusal` (consuming one of its ``times``)."""
        if self.allowed is not None and verb not in self.allowed.get(resource, set()):
            raise ApiStatusError(403, "Forbidden", f'{resource} is forbidden: User "system:serviceaccount:baton:'
                                                   f'baton-sandbox-host" cannot {verb} resource "{resource}"')
        for r in self.refusals:
            if r.verb in (verb, "*") and r.resource in (resource, "*"):
                if r.times is not None:
                    r.times -= 1
                    if r.times <= 0:
                        self.refusals.remove(r)
                raise ApiStatusError(r.code, r.reason, r.message)

    # --- reads ----------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        try:
            return copy.deepcopy(self.objects[(resource, namespace, name)])
        except KeyError:
            raise ApiStatusError(404, "NotFound", f'{resource} "{name}" not found') from None

    def list(self, resource: str, namespace: str | None, labels: str | None = None,
             fields: str | None = None) -> list[Obj]:
        match = selector(labels, fields)
        return [copy.deepcopy(o) for (res, ns, _), o in sorted(self.objects.items())
                if res == resource and (namespace is None or ns == namespace) and match(o)]

    def events_after(self, rv: int) -> Iterator[Event]:
        if self.history and rv < self.history[0].rv - 1:
            raise ApiStatusError(410, "Expired", f"too old resource version: {rv} ({self.history[0].rv - 1})")
        for e in self.history:
            if e.rv > rv:
                yield e

    # --- writes ---------------------------------------------------------------------------

    async def _emit(self, type_: str, resource: str, namespace: str, obj: Obj) -> None:
        self.history.append(Event(self.rv, type_, resource, namespace, copy.deepcopy(obj)))
        del self.history[:-HISTORY]
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _next_rv(self, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    async def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name or not _DNS_LABEL.fullmatch(name):
            raise ApiStatusError(422, "Invalid", f"{resource} name {name!r}: a lowercase RFC 1123 name is required")
        if (resource, namespace, name) in self.objects:
            raise ApiStatusError(409, "AlreadyExists", f'{resource} "{name}" already exists')
        meta.update(namespace=namespace, uid=str(uuid.uuid4()),
                    creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        obj.setdefault("status", {})
        self._next_rv(obj)
        self.objects[(resource, namespace, name)] = obj
        await self._emit("ADDED", resource, namespace, obj)
        return copy.deepcopy(obj)

    async def update(self, resource: str, namespace: str, name: str, status: Obj | None = None,
                     spec: Obj | None = None) -> Obj:
        """Merge ``status`` (and ``spec``) into the object (the kubelet's status updates)."""
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise ApiStatusError(404, "NotFound", f'{resource} "{name}" not found')
        if status:
            obj.setdefault("status", {}).update(copy.deepcopy(status))
        if spec:
            obj.setdefault("spec", {}).update(copy.deepcopy(spec))
        self._next_rv(obj)
        await self._emit("MODIFIED", resource, namespace, obj)
        return copy.deepcopy(obj)

    async def patch(self, resource: str, namespace: str, name: str, patch: Obj) -> Obj:
        """Apply a JSON merge patch (RFC 7386: ``application/merge-patch+json``); ``uid``,
        ``name`` and ``namespace`` stay. A ``data`` change of an ``immutable`` object is
        refused (422), as the API refuses it for Secrets."""
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise ApiStatusError(404, "NotFound", f'{resource} "{name}" not found')
        if obj.get("immutable") and any(k in patch for k in ("data", "stringData")):
            raise ApiStatusError(422, "Invalid", f'{resource} "{name}" is invalid: data: field is immutable')
        keep = {k: obj["metadata"][k] for k in ("uid", "name", "namespace") if k in obj["metadata"]}
        merged = _merge(obj, patch)
        merged["metadata"].update(keep)
        self.objects[(resource, namespace, name)] = merged
        self._next_rv(merged)
        await self._emit("MODIFIED", resource, namespace, merged)
        return copy.deepcopy(merged)

    async def delete(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete: graceful (``deletionTimestamp`` set) for a pod on a node, else at once."""
        obj = self.objects.get((resource, namespace, name))
        if obj is None:
            raise ApiStatusError(404, "NotFound", f'{resource} "{name}" not found')
        if resource in self.graceful and obj.get("spec", {}).get("nodeName"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                self._next_rv(obj)
                await self._emit("MODIFIED", resource, namespace, obj)
            return copy.deepcopy(obj)
        return await self.remove(resource, namespace, name)

    async def remove(self, resource: str, namespace: str, name: str) -> Obj:
        """Remove the object now (``DELETED``), then its dependents (garbage collection)."""
        obj = self.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise ApiStatusError(404, "NotFound", f'{resource} "{name}" not found')
        self._next_rv(obj)
        await self._emit("DELETED", resource, namespace, obj)
        uid = obj["metadata"]["uid"]
        for (res, ns, n), o in list(self.objects.items()):
            if ns == namespace and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                await self.delete(res, ns, n)
        return copy.deepcopy(obj)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, ``null`` removes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(expr: str) -> list[str]:
    """Comma-separated terms, commas inside ``( … )`` kept."""
    terms, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def _label_term(term: str) -> Any:
    m = _SET_TERM.match(term)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda lb: lb.get(key) in values
        return lambda lb: lb.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (s.strip() for s in term.split(op, 1))
            if op == "!=":
                return lambda lb: lb.get(key) != value
            return lambda lb: lb.get(key) == value
    if term.startswith("!"):
        return lambda lb: term[1:].strip() not in lb
    return lambda lb: term in lb


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def selector(labels: str | None, fields: str | None) -> Any:
    """A predicate over objects for a label selector and a field selector (``=``, ``==``,
    ``!=``; for labels also ``in``, ``notin``, ``key`` and ``!key``).

    Raises:
        ApiStatusError: 400 for a malformed selector.
    """
    try:
        label_terms = [_label_term(t) for t in _split_terms(labels or "")]
        field_terms = []
        for t in _split_terms(fields or ""):
            neg = "!=" in t
            key, value = (s.strip() for s in re.split(r"!=|==|=", t, maxsplit=1))
            field_terms.append((key, value, neg))
    except ValueError as exc:
        raise ApiStatusError(400, "BadRequest", f"unable to parse selector: {exc}") from exc

    def match(obj: Obj) -> bool:
        lb = obj.get("metadata", {}).get("labels") or {}
        if not all(t(lb) for t in label_terms):
            return False
        return all((_field(obj, k) == v) != neg for k, v, neg in field_terms)
    return match
