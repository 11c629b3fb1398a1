"""The chat page joins a live run from its snapshot's newest messages and loads the older
ones on scroll (Chromium, tests/node/page_snapshot.mjs): a run whose log gets a snapshot every
20 chunks is opened on the page (a reload) mid-run, after a snapshot of more messages than a
join asks for; the page shows the newest messages, then the older ones as the reader scrolls
up, and follows the run to its end, each chunk once. A page opened on the closed run then joins
it from its snapshot too, and once scrolled to the top shows the same: every message the run
wrote, in order.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.v1 import runs_pb2
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, GatewayFactory, write_run
from tests.gateway.test_pages import KEYS, A, need_browser, run_page_script
from tests.gateway.test_snapshot_join import turns

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

TURNS = 100  # assistant turns written before the page opens (a text message and a tool call each)


async def test_a_page_reloaded_mid_run_shows_the_newest_messages_then_the_older_ones_on_scroll(
        make_gateway: GatewayFactory, cc: Any, dlog: DeliveryLog, log_cfg: LogConfig,
        http: httpx.AsyncClient) -> None:
    node = need_browser()
    gw: Gateway = await make_gateway(keepalive=0.5, api_keys=KEYS)
    # The test drives the run: it holds the run's claim (so no host of another module takes it
    # over) and writes its log with the real writer, a snapshot due every 20 chunks (parts
    # of 4 KiB, so a join reads only some of them).
    sdlog = DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=20, snapshot_part_bytes=4096))
    thread, run = unique("snap-th-"), unique("snap-run-")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, tenant="tenant-a",
                                                     started_at=time.time(), status=runs_pb2.RUN_STATUS_RUNNING),
                                  interrupt_active=False)
    session = await cc.open_session(ttl=10.0, owner="test-driver")
    try:
        epoch, _ = await cc.claim_run(run, session, "test-driver", purpose="drive")
        chunks = turns(run, thread, TURNS + 10)
        w, written = await write_run(sdlog, run, chunks[:2 + 8 * TURNS], close=False, epoch=epoch)

        async def snapshot_of_many() -> bool:
            found = await latest_snapshot(sdlog.nc, sdlog.cfg, run)
            return found is not None and len(found[0].messages) > 120
        await assert_eventually(snapshot_of_many, timeout=30)

        async def answer(msg: dict[str, Any]) -> dict[str, Any] | None:
            if msg.get("finish"):
                # The page showed every message so far: the run goes on and ends.
                await w.append(chunks[2 + 8 * TURNS:], origin="journal")
                await w.close("completed")
                await cc.update_run(run, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_COMPLETED,
                                                            finished_at=time.time()), ["status", "finished_at"],
                                    epoch=epoch, session_id=session)

                async def listed_completed() -> bool:
                    r = await http.get(f"{gw.url}/api/threads/{thread}/runs", headers=A)
                    return bool(r.json()["runs"][0]["status"] == "completed")
                # The page opened next finds the run closed.
                await assert_eventually(listed_completed, timeout=20)
                return {"finished": True}
            return None
        result = await run_page_script(node, "page_snapshot.mjs", gw, timeout=240, on_line=answer,
                                       env={"BATON_THREAD": thread, "BATON_RUN": run})
    finally:
        await session.close()
    assert result["window"]["messagesOmitted"] > 0
    # The page asked for the newest 50 messages of the snapshot; what was stored after the
    # snapshot's offset follows it (a snapshot waits for as many bytes as the last one weighs,
    # so that tail can be several turns long). Never the whole history.
    after = int(result["window"]["snapshotOffset"])
    tail = sum(1 for c, o in zip(chunks, written)
               if int(o) > after and c["type"] in ("TEXT_MESSAGE_START", "TOOL_CALL_RESULT"))
    assert result["firstShown"] <= 50 + tail
    # Every message the run wrote once, in order, on the page that followed it and on the
    # page that opened it closed (from its snapshot's newest messages, then scrolled up).
    texts = [c["delta"] for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT"]
    want_texts = [a + b for a, b in zip(texts[::2], texts[1::2])]
    want_tools = [c["toolCallId"] for c in chunks if c["type"] == "TOOL_CALL_START"]
    assert len(want_texts) == TURNS + 10
    for items in (result["items"], result["closed"]):
        assert [i[1] for i in items if i[0] == "assistant"] == want_texts
        assert [i[1] for i in items if i[0] == "tool"] == want_tools
    assert result["items"] == result["closed"]
    # The closed run was opened from its snapshot: its newest messages first, older on scroll.
    assert result["closedOlderMarkers"] == 1
    assert result["closedFirstShown"] < TURNS + 10
