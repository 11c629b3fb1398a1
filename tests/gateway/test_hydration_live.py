"""The TanStack hydration equals what the live ``@tanstack/ai-client`` built, for every corpus
journal replayed on a real cluster (``tests/node/tanstack_hydration.mjs``), and the fold
behind it (:mod:`gateway._ui_stream`) equals the client's own ``StreamProcessor`` on the
translated chunks, whole and cut (``tests/node/tanstack_live_messages.mjs``)."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
from typing import Any

import pytest

from baton_tools.testing.servers import env_without_proxy
from gateway._ui_stream import UIStreamFolder
from sandbox_host.journal import LineSplitter
from sandbox_host.translate import translate_bytes, translator_for
from tests.conftest import REPO, unique
from tests.gateway.conftest import Gateway
from tests.gateway.test_node import need_node, run_node

NODE_DIR = REPO / "tests" / "node"
JOURNALS = sorted(p for kind in ("claude-stream-json", "codex-exec-json") for p in (REPO / "corpus" / kind).glob("*.jsonl"))
GENERATED = re.compile(r"^msg-\d+-[a-z0-9]+$")


def _prompt(i: int) -> dict[str, Any]:
    return {"id": f"u{i}", "role": "user", "parts": [{"type": "text", "content": f"go {i}"}]}


@pytest.mark.node
@pytest.mark.timeout(120)
def test_fold_equals_the_clients_stream_processor(tmp_path: pathlib.Path) -> None:
    """Every corpus journal's chunks, whole and cut mid-file, one thread per journal and one
    thread of them all: the fold gives the messages the live ChatClient built, and a
    ChatClient hydrated with them shows exactly them."""
    need_node("@tanstack/ai-client")
    runs: dict[str, list[dict[str, Any]]] = {}
    for j in JOURNALS:
        data = j.read_bytes()
        runs[j.stem] = translate_bytes(j.parent.name, data, "run-1", "thread-1")
        sp, tr = LineSplitter(), translator_for(j.parent.name, "run-c", "thread-1")
        cut: list[dict[str, Any]] = []
        for line in sp.feed(data[: len(data) // 2]):
            cut += tr.feed(line.data)
        runs[j.stem + "#cut"] = cut + tr.finish(None, sp.pending or None)
    threads = {name: [name] for name in runs} | {"all": list(runs)}
    streams: dict[str, Any] = {}
    for name, turns in threads.items():
        folder = UIStreamFolder()
        for i, r in enumerate(turns):
            folder.add_messages([_prompt(i)])
            folder.fold_run(f"run-{i}", runs[r])
        streams[name] = {"turns": [{"prompt": _prompt(i), "chunks": runs[r]} for i, r in enumerate(turns)],
                         "hydration": {"messages": folder.messages, "activeRun": None}}
    path = tmp_path / "streams.json"
    path.write_text(json.dumps(streams))
    out = subprocess.run(["node", str(NODE_DIR / "tanstack_live_messages.mjs"), str(path)], cwd=NODE_DIR,
                         env=env_without_proxy(), capture_output=True, text=True, timeout=100, check=True)
    result = json.loads(out.stdout)
    for name, got in result.items():
        ours = streams[name]["hydration"]["messages"]
        live = [{**m, "id": ours[i]["id"]} if GENERATED.match(m["id"]) and i < len(ours) else m
                for i, m in enumerate(got["live"])]
        assert live == ours, name
        assert got["hydrated"] == ours, name
    # The cases: a subagent run is 3 assistant messages (not 10), and two reasoning
    # blocks of one step are one thinking part (335 + 177 = 512 characters).
    sub = streams["subagents-parallel-tools-v2.0.25"]["hydration"]["messages"]
    assert [m["role"] for m in sub] == ["user", "assistant", "assistant", "assistant"]
    bash = streams["partial-messages-bash-exit-128"]["hydration"]["messages"]
    assert [len(p["content"]) for p in bash[1]["parts"] if p["type"] == "thinking"] == [512]


@pytest.mark.node
@pytest.mark.timeout(300)
async def test_hydration_equals_the_live_client_for_every_corpus_journal(host: Any, gateway: Gateway) -> None:
    """Real runs (replay agent, real host and gateway): per corpus journal a thread of one
    run, plus a thread of three turns; a reloaded ChatClient (``persistence: true``) shows
    exactly what the live one built, whole and paged (``history.pageSize`` 2, then
    ``loadOlderMessages`` to the start)."""
    node = need_node("@tanstack/ai-client")
    threads = [{"thread": unique(f"hyd-{j.stem[:20]}-"), "journals": [f"{j.parent.name}/{j.name}"]} for j in JOURNALS]
    threads.append({"thread": unique("hyd-turns-"), "journals": [
        "codex-exec-json/zsh-commands-and-file-change.jsonl", "claude-stream-json/partial-messages-bash-exit-128.jsonl",
        "claude-stream-json/subagents-parallel-tools-v2.0.25.jsonl"]})
    result = await run_node(node, "tanstack_hydration.mjs", {
        "BATON_GATEWAY_URL": gateway.url, "BATON_THREADS": json.dumps(threads), "BATON_PAGE": "2"}, timeout=280)
    got = result["threads"]
    assert set(got) == {t["thread"] for t in threads}
    # Per turn the prompt and the answer's messages, as the live client split them (the
    # subagent run: 3 assistant messages, where the saved transcript has 10).
    assert got[threads[-1]["thread"]]["messages"] == 3 + 3 + 4
    by_stem = {j.stem: got[t["thread"]] for j, t in zip(JOURNALS, threads)}
    assert by_stem["subagents-parallel-tools-v2.0.25"]["messages"] == 4
    assert set(result["rejections"]) <= {"error_max_turns"}


@pytest.mark.node
@pytest.mark.timeout(120)
async def test_the_two_reload_bugs_are_the_clients_own_and_a_leading_snapshot_cures_both() -> None:
    """``@tanstack/ai-client`` alone, no baton (``tests/node/tanstack_rejoin_bugs.mjs``): a
    rejoin with server persistence of a run that starts with reasoning loses the reasoning
    and the first text message; a rejoin with client (storage) persistence doubles the text
    of each stored message that ended in a tool result; both replays preceded by one
    ``MESSAGES_SNAPSHOT`` of the run's input equal the undisturbed run."""
    node = need_node("@tanstack/ai-client")
    result = await run_node(node, "tanstack_rejoin_bugs.mjs", {}, timeout=110)
    server, client = result["server"], result["client"]
    assert server["bug"] and server["withSnapshot"] == server["live"] != server["reloaded"]
    assert client["bug"] and client["rejoins"] > 0 and client["duplicatedAt"] and not client["withSnapshotDiffers"]
