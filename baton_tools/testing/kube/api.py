"""The stand-in Kubernetes API server's HTTP routes (a Starlette app over :class:`Store`).

A **stand-in**: the REST paths, JSON shapes and ``Status`` errors of the API server for what
the ``kubernetes`` provider uses, nothing more. Served:

- ``/api/v1/namespaces/{ns}/{pods|secrets}`` and
  ``/apis/agents.x-k8s.io/v1alpha1/namespaces/{ns}/sandboxes`` (only while the agent-sandbox
  CRD is "installed": :attr:`Store.extra_resources`): create (POST), list (GET with
  ``labelSelector``, ``fieldSelector``), watch (``watch=true`` with ``resourceVersion``,
  ``timeoutSeconds``: one JSON event per line), get, delete and merge-patch
  (``application/merge-patch+json``) by name;
- ``/version``;
- a bearer token when one is configured (401 otherwise);
- ``/_standin/refusals``: POST a :class:`Refusal` as JSON, DELETE clears them all.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from baton_tools.testing.kube.store import ApiStatusError, Refusal, Store

CORE = {"pods": "Pod", "secrets": "Secret"}
SANDBOXES = "sandboxes.agents.x-k8s.io"
GROUPS = {("agents.x-k8s.io", "v1alpha1", "sandboxes"): (SANDBOXES, "Sandbox")}


def _resource(req: Request) -> tuple[str, str, str]:
    """``(store resource, kind, apiVersion)`` of the path, or a 404 ``Status``."""
    p = req.path_params
    if "group" not in p:
        plural = p["plural"]
        if plural in CORE:
            return plural, CORE[plural], "v1"
    else:
        found = GROUPS.get((p["group"], p["version"], p["plural"]))
        if found is not None and found[0] in req.app.state.store.extra_resources:
            return found[0], found[1], f"{p['group']}/{p['version']}"
    raise ApiStatusError(404, "NotFound", "the server could not find the requested resource")


def _status(exc: ApiStatusError) -> JSONResponse:
    return JSONResponse(exc.status(), status_code=exc.code)


def _authorized(req: Request) -> None:
    token = req.app.state.token
    if token and req.headers.get("authorization") != f"Bearer {token}":
        raise ApiStatusError(401, "Unauthorized", "Unauthorized")


async def collection(req: Request) -> Response:
    store: Store = req.app.state.store
    try:
        _authorized(req)
        res, kind, api_version = _resource(req)
        ns = req.path_params["ns"]
        if req.method == "POST":
            store.check("create", res)
            body = await req.json()
            if body.get("kind") not in (None, kind):
                raise ApiStatusError(400, "BadRequest", f"kind {body.get('kind')!r} posted to {res}")
            body.update(kind=kind, apiVersion=api_version)
            return JSONResponse(await store.create(res, ns, body), status_code=201)
        q = req.query_params
        if q.get("watch") in ("true", "1"):
            store.check("watch", res)
            return StreamingResponse(_watch(store, res, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                            q.get("resourceVersion"), q.get("timeoutSeconds")),
                                     media_type="application/json")
        store.check("list", res)
        items = store.list(res, ns, q.get("labelSelector"), q.get("fieldSelector"))
        return JSONResponse({"kind": f"{kind}List", "apiVersion": api_version,
                             "metadata": {"resourceVersion": str(store.rv)}, "items": items})
    except ApiStatusError as exc:
        return _status(exc)


async def item(req: Request) -> Response:
    store: Store = req.app.state.store
    try:
        _authorized(req)
        res, _, _ = _resource(req)
        ns, name = req.path_params["ns"], req.path_params["name"]
        if req.method == "DELETE":
            store.check("delete", res)
            return JSONResponse(await store.delete(res, ns, name))
        if req.method == "PATCH":
            store.check("patch", res)
            if req.headers.get("content-type", "").split(";")[0].strip() != "application/merge-patch+json":
                raise ApiStatusError(415, "UnsupportedMediaType", "the stand-in takes merge patches only")
            return JSONResponse(await store.patch(res, ns, name, await req.json()))
        store.check("get", res)
        return JSONResponse(store.get(res, ns, name))
    except ApiStatusError as exc:
        return _status(exc)


async def _watch(store: Store, res: str, ns: str, labels: str | None, fields: str | None,
                 rv_param: str | None, timeout: str | None) -> AsyncIterator[bytes]:
    from baton_tools.testing.kube.store import selector

    match = selector(labels, fields)
    deadline = time.monotonic() + float(timeout) if timeout else None
    if rv_param in (None, "", "0"):
        # No version: the current objects as ADDED, then what follows (the API's semantics).
        for obj in store.list(res, ns, labels, fields):
            yield _line("ADDED", obj)
        rv = store.rv
    else:
        rv = int(rv_param)
    while True:
        try:
            events = list(store.events_after(rv))
        except ApiStatusError as exc:
            yield _line("ERROR", exc.status())
            return
        for e in events:
            rv = e.rv
            if e.resource == res and e.namespace == ns and match(e.obj):
                yield _line(e.type, e.obj)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        changed = store.changed()
        if store.rv == rv:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left or 30.0, 30.0)):
                    await changed.wait()


def _line(type_: str, obj: Any) -> bytes:
    return json.dumps({"type": type_, "object": obj}).encode() + b"\n"


async def version(req: Request) -> Response:
    return JSONResponse({"major": "1", "minor": "33", "gitVersion": "v1.33.0-baton-standin"})


async def refusals(req: Request) -> Response:
    store: Store = req.app.state.store
    if req.method == "DELETE":
        store.refusals.clear()
        return JSONResponse({})
    body = await req.json()
    store.refusals.append(Refusal(**body))
    return JSONResponse(body, status_code=201)


def make_app(store: Store, token: str | None = None, extra_routes: list[Route] | None = None) -> Starlette:
    """The API server app over ``store``; ``token``: the bearer token it demands."""
    routes = [
        Route("/version", version),
        Route("/api/v1/namespaces/{ns}/{plural}", collection, methods=["GET", "POST"]),
        Route("/api/v1/namespaces/{ns}/{plural}/{name}", item, methods=["GET", "DELETE", "PATCH"]),
        Route("/apis/{group}/{version}/namespaces/{ns}/{plural}", collection, methods=["GET", "POST"]),
        Route("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", item, methods=["GET", "DELETE", "PATCH"]),
        Route("/_standin/refusals", refusals, methods=["POST", "DELETE"]),
        *(extra_routes or []),
    ]
    app = Starlette(routes=routes)
    app.state.store = store
    app.state.token = token
    return app
