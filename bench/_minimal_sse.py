"""The minimal SSE endpoint bench/gateway.py measures the gateway against: one Starlette
app serving the same bytes from memory (``python -m bench._minimal_sse PORT``)."""
from __future__ import annotations

import asyncio
import sys
from typing import Any


def minimal_app() -> Any:
    """One in-memory hub per run id: a publish is framed once and put on every reader's queue."""
    import itertools

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    hubs: dict[str, set[asyncio.Queue[bytes]]] = {}
    seq = itertools.count(1)

    async def sse(request: Request) -> Response:
        run = request.query_params["runId"]
        q: asyncio.Queue[bytes] = asyncio.Queue()
        hubs.setdefault(run, set()).add(q)

        async def body() -> Any:
            try:
                while True:
                    try:
                        async with asyncio.timeout(15):
                            item = await q.get()
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield item
            finally:
                hubs[run].discard(q)

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def publish(request: Request) -> Response:
        # One chunk JSON per line (a batch, like one log append of several chunks).
        run = request.query_params["runId"]
        for line in (await request.body()).split(b"\n"):
            frame = b"id: %d\ndata: %s\n\n" % (next(seq), line)
            for q in hubs.get(run, ()):
                q.put_nowait(frame)
        return Response(status_code=204)

    async def readers(request: Request) -> Response:
        return JSONResponse({"readers": sum(len(s) for s in hubs.values())})

    return Starlette(routes=[Route("/sse", sse), Route("/publish", publish, methods=["POST"]),
                             Route("/readers", readers)])


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(minimal_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
