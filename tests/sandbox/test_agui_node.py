"""Our chunks through the official AG-UI verifier (@ag-ui/core EventSchema + @ag-ui/client
verifyEvents), run by ``tests/node/verify_agui.mjs``; the bad corpus streams are rejected."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

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
    streams = {p.stem: [json.loads(l) for l in p.read_text().splitlines()] for p in AGUI_FILES}
    result = _verify(streams, tmp_path)
    assert result["pydantic-ai-parallel-tools"] == {"ok": True, "count": 27}
    assert not result["langgraph-raw-steps-snapshots"]["ok"]
    assert 'Step "tools" is already active' in result["langgraph-raw-steps-snapshots"]["error"]
    assert not result["vercel-run-error-then-finished"]["ok"]
    assert "threadId" in result["vercel-run-error-then-finished"]["error"]
