"""Our chunks through the official AG-UI verifier (@ag-ui/core EventSchema + @ag-ui/client
verifyEvents), run by ``tests/node/verify_agui.mjs``; the bad corpus streams are rejected."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from baton.transcript import build_transcript
from baton_tools.testing.servers import env_without_proxy
from sandbox_host.journal import LineSplitter
from sandbox_host.translate import translate_bytes, translator_for
from tests.conftest import REPO
from tests.sandbox.conftest import AGUI_FILES, CLAUDE_FILES, CODEX_FILES

NODE_DIR = REPO / "tests" / "node"
pytestmark = [
    pytest.mark.node,
    pytest.mark.requires(shutil.which("node") is not None, reason="node is not installed"),
    pytest.mark.requires((NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir(),
                         reason="npm package @ag-ui/client missing (make node-deps)"),
]


def _verify(streams: dict[str, list[dict]], tmp_path: pathlib.Path) -> dict[str, dict]:
    path = tmp_path / "streams.json"
    path.write_text(json.dumps(streams))
    out = subprocess.run(["node", str(NODE_DIR / "verify_agui.mjs"), str(path)], cwd=NODE_DIR,
                         env=env_without_proxy(), capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_official_verifier_accepts_our_chunks(tmp_path: pathlib.Path) -> None:
    streams: dict[str, list[dict]] = {}
    for journal in CLAUDE_FILES + CODEX_FILES:
        data = journal.read_bytes()
        streams[journal.stem] = translate_bytes(journal.parent.name, data, "run-1", "thread-1")
        # Cut mid-file (a killed agent): still valid AG-UI, ending in RUN_ERROR.
        sp, tr = LineSplitter(), translator_for(journal.parent.name, "run-1", "thread-1")
        cut: list[dict] = []
        for line in sp.feed(data[: len(data) * 2 // 3]):
            cut += tr.feed(line.data)
        streams[journal.stem + "#cut"] = cut + tr.finish(None, sp.pending or None)
    streams["hostile"] = translate_bytes("claude-stream-json", b'nope\n{"__exit":0,"__nonce":"x"}\n\xff\n{"type":"?"}\n',
                                         "run-1", "thread-1")
    result = _verify(streams, tmp_path)
    assert result == {name: {"ok": True, "count": len(chunks)} for name, chunks in streams.items()}


def test_official_verifier_rejects_the_bad_corpus_streams(tmp_path: pathlib.Path) -> None:
    streams = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in AGUI_FILES}
    result = _verify(streams, tmp_path)
    assert result["pydantic-ai-parallel-tools"] == {"ok": True, "count": 27}
    assert not result["langgraph-raw-steps-snapshots"]["ok"]
    assert 'Step "tools" is already active' in result["langgraph-raw-steps-snapshots"]["error"]
    assert not result["vercel-run-error-then-finished"]["ok"]
    assert "threadId" in result["vercel-run-error-then-finished"]["error"]


def test_transcript_equals_what_the_agui_client_assembles(tmp_path: pathlib.Path) -> None:
    """baton's transcript builder and @ag-ui/client's defaultApplyEvents (what HttpAgent runs)
    give the same messages from the same chunks: reasoning messages with their signature
    (encryptedValue), subagent tool calls grouped under their parent message, tool results
    after their call with the structured metadata; for every corpus journal, whole and cut."""
    streams: dict[str, list[dict]] = {}
    for journal in CLAUDE_FILES + CODEX_FILES:
        data = journal.read_bytes()
        streams[journal.stem] = translate_bytes(journal.parent.name, data, "run-1", "thread-1")
        sp, tr = LineSplitter(), translator_for(journal.parent.name, "run-1", "thread-1")
        cut: list[dict] = []
        for line in sp.feed(data[: len(data) // 2]):
            cut += tr.feed(line.data)
        streams[journal.stem + "#cut"] = cut + tr.finish(None, sp.pending or None)
    path = tmp_path / "streams.json"
    path.write_text(json.dumps(streams))
    out = subprocess.run(["node", str(NODE_DIR / "apply_agui.mjs"), str(path)], cwd=NODE_DIR,
                         env=env_without_proxy(), capture_output=True, text=True, timeout=60, check=True)
    assembled = json.loads(out.stdout)
    for name, chunks in streams.items():
        assert build_transcript(chunks, []) == assembled[name], name
    ours = build_transcript(streams["read-cap-autocompact-multi-turn-v2.1.285"], [])
    assert [m["role"] for m in ours[:4]] == ["reasoning", "assistant", "tool", "reasoning"]
    assert ours[0]["content"] == "" and ours[0]["encryptedValue"].startswith("Ep0DCtAB")
    assert ours[2]["metadata"]["toolUseResult"]["file"]["truncatedByTokenCap"] is True
    subagent = build_transcript(streams["subagents-parallel-tools-v2.0.25"], [])
    first = next(m for m in subagent if m["id"] == "msg_01Rws28Xg2tBY3A5fNdrk6Mf")
    assert [c["function"]["name"] for c in first["toolCalls"]] == [
        "Glob", "Grep", "Read", "Task", "Task", "WebSearch", "TodoWrite"]
