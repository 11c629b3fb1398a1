"""A hostile client and a careless operator against coding sessions (docs/design.md §4.3).

Real hosts with the stand-in CLIs, real etcd/NATS, a gateway with two tenants' API keys.
Each test is one attack: a passing test means the system held; a finding is a test marked
``xfail(strict=True, reason="finding: ...")`` that fails on the code as it is. The last test
sweeps every place a secret could land (host logs, journals, this process's log records,
error bodies, every JetStream message, every head's workspace) for the secrets used here.
"""
from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import shutil
from typing import Any, AsyncIterator, Iterator

import httpx
import nats.js.errors as nats_errors
import pytest

from baton.ids import file_stem
from baton.log import LogConfig
from baton.sse import Comment, aiter_sse
from tests.conftest import unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.sandbox.gitrepos import GitHttpServer, Repo, git_http_server, make_repo
from tests.session_attacks_support import (
    GIT_TOKEN, GIT_USER, HOST_SECRET, KEY_A, KEY_B, OUTSIDE_CONTENT, SECRETS, TENANT_A, TENANT_B, AttackCluster,
    Records, basic, files_holding, jetstream_holding, make_outside_repo, make_tricks_repo)
from tests.sessions_support import chat_body, driver_of, history, terminal, texts, turn

pytestmark = pytest.mark.timeout(300)

#: Every error body a test received, for the final sweep.
BODIES: list[str] = []


class World:
    def __init__(self, root: pathlib.Path, repo: Repo, tricks: pathlib.Path, outside: pathlib.Path,
                 git_server: GitHttpServer, thief: GitHttpServer) -> None:
        self.root, self.allowed, self.repo = root, root / "allowed", repo
        self.tricks, self.outside, self.git_server, self.thief = tricks, outside, git_server, thief


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("attacks")
    allowed = root / "allowed"
    allowed.mkdir()
    repo, tricks, outside = make_repo(allowed), make_tricks_repo(allowed), make_outside_repo(root)
    (allowed / "link-out").symlink_to(outside)  # inside the allow-list, pointing out of it
    served = root / "served"
    make_repo(served, "private.git")
    with git_http_server(served, GIT_USER, GIT_TOKEN) as git_server, \
            git_http_server(root / "thief-root", "thief", "nothing") as thief:
        yield World(root, repo, tricks, outside, git_server, thief)


@pytest.fixture(scope="module")
def records() -> Iterator[Records]:
    handler = Records()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.fixture(scope="module")
async def cluster(world: World, records: Records, coordinator: Any, nats: Any, log_cfg: LogConfig,
                  replay_dir: pathlib.Path) -> AsyncIterator[AttackCluster]:
    creds = world.root / "creds.json"
    creds.write_text(json.dumps({TENANT_A: {"ci": {"username": GIT_USER, "token": GIT_TOKEN,
                                                   "url": world.git_server.url("")}}}))
    settings = {**host_settings(log_cfg, replay_dir, world.root), "BATON_WORKSPACE_DIRS": str(world.allowed),
                "BATON_WORKSPACE_OBJECTS": unique("ws-objects"), "BATON_WORKSPACE_HEADS": unique("ws-heads"),
                "BATON_GIT_CREDENTIALS_FILE": str(creds)}
    c = AttackCluster(world.root, world.repo, world.allowed, coordinator, nats, settings)
    await c.add_host()
    await c.add_host()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def gw(cluster: AttackCluster, make_gateway: Any) -> Gateway:
    from baton.workspaces import WorkspaceConfig

    ws_cfg = WorkspaceConfig.from_env({k: v for k, v in cluster.settings.items() if k.startswith("BATON_WORKSPACE_")})
    made: Gateway = await make_gateway(keepalive=0.5, workspace_dirs=(str(cluster.allowed.resolve()),),
                                       workspace_config=ws_cfg, api_keys={KEY_A: TENANT_A, KEY_B: TENANT_B})
    return made


@pytest.fixture
async def a() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"Authorization": f"Bearer {KEY_A}"}) as c:
        yield c


@pytest.fixture
async def b() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"Authorization": f"Bearer {KEY_B}"}) as c:
        yield c


def kept(resp: httpx.Response) -> httpx.Response:
    BODIES.append(resp.text)
    return resp


def chill(cluster: AttackCluster, thread: str) -> None:
    """Remove the thread's warm directory: its next turn restores from the snapshot alone."""
    shutil.rmtree(cluster.tmp / "sandboxes" / "threads" / file_stem(thread), ignore_errors=True)


async def ok_turn(http: httpx.AsyncClient, gw: Gateway, thread: str, prompt: str,
                  workspace: dict[str, Any] | None = None, kind: str = "claude-code") -> tuple[str, str]:
    run_id, chunks = await turn(http, gw, thread, kind, prompt, workspace)
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    return run_id, texts(chunks)


def split(secret: str) -> str:
    """A shell word for ``secret`` that does not hold it (prompts are saved: they must not)."""
    return f'"{secret[:6]}""{secret[6:]}"'


def between(seen: str, start: str, end: str) -> str:
    return seen.split(start, 1)[1].split(end, 1)[0]


def assert_404(resp: httpx.Response, reason: str) -> None:
    kept(resp)
    assert resp.status_code == 404 and resp.json()["reason"] == reason, resp.text


# --- tenancy --------------------------------------------------------------------------------


async def test_another_tenant_cannot_touch_a_thread_or_its_fork(
        cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    thread = unique("a-thr-")
    run1, seen = await ok_turn(a, gw, thread, "write private.txt A-PRIVATE-TEXT", {"git": f"file://{cluster.repo.bare}"})
    fork = unique("a-fork-")
    assert kept(await a.post(f"{gw.url}/api/threads/{thread}/fork", json={"runId": run1, "newThreadId": fork})).status_code == 201

    for target in (thread, fork):
        assert_404(await b.post(f"{gw.url}/api/threads/{target}/fork", json={"runId": run1}), "UNKNOWN_THREAD")
        assert_404(await b.post(f"{gw.url}/api/threads/{target}/fork",
                                json={"runId": run1, "newThreadId": unique("b-")}), "UNKNOWN_THREAD")
        assert_404(await b.get(f"{gw.url}/api/threads/{target}/messages"), "UNKNOWN_THREAD")
        assert_404(await b.delete(f"{gw.url}/api/threads/{target}"), "UNKNOWN_THREAD")
        run_b = unique("run-b-")
        body = chat_body(target, "claude-code", "run cat private.txt", [])
        assert_404(await b.post(f"{gw.url}/api/chat?runId={run_b}", json=body), "UNKNOWN_THREAD")
        assert_404(await b.get(f"{gw.url}/api/runs/{run_b}"), "UNKNOWN_RUN")
    assert_404(await b.get(f"{gw.url}/api/runs/{run1}"), "UNKNOWN_RUN")
    assert all("A-PRIVATE-TEXT" not in body for body in BODIES)

    # A's thread and fork are as they were: A's next turns see A's file.
    _, seen = await ok_turn(a, gw, fork, "run cat private.txt")
    assert "A-PRIVATE-TEXT" in seen
    _, seen = await ok_turn(a, gw, thread, "run cat private.txt")
    assert "A-PRIVATE-TEXT" in seen


async def test_another_tenant_cannot_take_a_fork_with_a_run_of_another_kind(
        cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    thread = unique("a-thr-")
    run1, _ = await ok_turn(a, gw, thread, "say A-FORKED-SECRET-PROMPT", {"git": f"file://{cluster.repo.bare}"})
    fork = unique("a-fork-")
    assert kept(await a.post(f"{gw.url}/api/threads/{thread}/fork", json={"runId": run1, "newThreadId": fork})).status_code == 201

    # B names the fork's id with an agent kind that keeps no session (the host's head check
    # is for claude-code and codex only).
    run_b = unique("run-b-")
    body = {"threadId": fork, "agent": {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1},
            "messages": [{"id": "m1", "role": "user", "content": "hi"}]}
    started = await read_stream(b, "POST", f"{gw.url}/api/chat?runId={run_b}", json=body, stop_after=1,
                                headers={"Authorization": f"Bearer {KEY_B}"})
    leaked = kept(await b.get(f"{gw.url}/api/threads/{fork}/messages"))
    owner_a = kept(await a.get(f"{gw.url}/api/threads/{fork}/messages"))
    assert "A-FORKED-SECRET-PROMPT" not in leaked.text
    assert started.status == 404, started
    assert owner_a.status_code == 200


async def test_a_fork_is_readable_by_its_tenant_before_its_first_run(
        cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("a-thr-")
    run1, _ = await ok_turn(a, gw, thread, "say hello", {"git": f"file://{cluster.repo.bare}"})
    fork = unique("a-fork-")
    resp = kept(await a.post(f"{gw.url}/api/threads/{thread}/fork", json={"runId": run1, "newThreadId": fork}))
    assert resp.status_code == 201 and resp.json()["messages"] > 0
    got = kept(await a.get(f"{gw.url}/api/threads/{fork}/messages"))
    assert got.status_code == 200, got.text


# --- hostile workspace input ----------------------------------------------------------------


def hostile(world: World) -> dict[str, tuple[dict[str, Any], str]]:
    """Workspaces the gateway (and the host) must refuse: ``{case: (workspace, field)}``."""
    allowed = str(world.allowed)
    return {
        "https-user-pass": ({"git": "https://someone:pass-SECRET-1@git.example.com/r.git"}, "workspace.git"),
        "https-token-user": ({"git": "https://tok-SECRET-2@git.example.com/r.git"}, "workspace.git"),
        "ssh-user-pass": ({"git": "ssh://git:pw-SECRET-3@git.example.com/r.git"}, "workspace.git"),
        "git-user-pass": ({"git": "git://u:pw-SECRET-4@git.example.com/r.git"}, "workspace.git"),
        "ext-transport": ({"git": "ext::sh -c touch% /tmp/pwned"}, "workspace.git"),
        "ext-no-space": ({"git": "ext::/tmp/pwned"}, "workspace.git"),
        "upload-pack": ({"git": "--upload-pack=touch /tmp/pwned"}, "workspace.git"),
        "upload-pack-joined": ({"git": "-u/tmp/pwned"}, "workspace.git"),
        "scp-dash-host": ({"git": "-oProxyCommand=x@h:r"}, "workspace.git"),
        "file-outside": ({"git": "file:///etc"}, "workspace.git"),
        "file-dotdot": ({"git": f"file://{allowed}/../outside/secret.git"}, "workspace.git"),
        "path-outside": ({"git": str(world.outside)}, "workspace.git"),
        "file-link-out": ({"git": f"file://{allowed}/link-out"}, "workspace.git"),
        "dir-dotdot": ({"dir": f"{allowed}/../outside"}, "workspace.dir"),
        "dir-relative": ({"dir": "allowed/../outside"}, "workspace.dir"),
        "dir-link-out": ({"dir": f"{allowed}/link-out"}, "workspace.dir"),
        "ref-option": ({"git": f"file://{world.repo.bare}", "ref": "--output=/tmp/pwned"}, "workspace.ref"),
        "ref-space": ({"git": f"file://{world.repo.bare}", "ref": "main --upload-pack=x"}, "workspace.ref"),
        "ref-dotdot": ({"git": f"file://{world.repo.bare}", "ref": "a..b"}, "workspace.ref"),
        "cred-plain-ssh": ({"git": "ssh://git.example.com/r.git", "credential": "ci"}, "workspace.credential"),
        "cred-other-tenant": ({"git": world.git_server.url("private.git"), "credential": "ci"}, "workspace.credential"),
        "unknown-field": ({"git": f"file://{world.repo.bare}", "env": {"GIT_SSH_COMMAND": "x"}}, "workspace.env"),
    }


CASES = ["https-user-pass", "https-token-user", "ssh-user-pass", "git-user-pass", "ext-transport", "ext-no-space",
         "upload-pack", "upload-pack-joined", "scp-dash-host", "file-outside", "file-dotdot", "path-outside",
         "file-link-out", "dir-dotdot", "dir-relative", "dir-link-out", "ref-option", "ref-space", "ref-dotdot",
         "cred-plain-ssh", "cred-other-tenant", "unknown-field"]


@pytest.mark.parametrize("case", CASES)
async def test_hostile_workspace_input_is_refused_before_anything_exists(
        case: str, world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient,
        b: httpx.AsyncClient) -> None:
    workspace, field = hostile(world)[case]
    client = b if case == "cred-other-tenant" else a  # the credential is tenant A's only
    run_id = unique("run-")
    resp = kept(await client.post(f"{gw.url}/api/chat?runId={run_id}",
                                  json=chat_body(unique("thr-"), "claude-code", "run ls", [], workspace)))
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["reason"] == "INVALID_ARGUMENT" and body["field"] == field, body
    assert "SECRET" not in resp.text  # a URL's value is never quoted
    assert (await client.get(f"{gw.url}/api/runs/{run_id}")).status_code == 404
    assert not pathlib.Path("/tmp/pwned").exists()


async def test_a_percent_encoded_dotdot_does_not_escape_the_allow_list(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    url = f"file://{world.allowed}/%2e%2e/outside/secret.git"
    run_id = unique("run-")
    body = chat_body(unique("thr-"), "claude-code", "run cat secret.txt", [], {"git": url})
    got = await read_stream(a, "POST", f"{gw.url}/api/chat?runId={run_id}", json=body)
    seen = texts([c for _, c in got.events])
    assert OUTSIDE_CONTENT not in seen  # the clone must not have happened
    assert got.status == 400


async def test_a_credential_is_never_sent_to_an_origin_the_request_chooses(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    run_id = unique("run-")
    ws = {"git": world.thief.url("anything.git"), "credential": "ci"}
    got = await read_stream(a, "POST", f"{gw.url}/api/chat?runId={run_id}",
                            json=chat_body(unique("thr-"), "claude-code", "run ls", [], ws))
    assert got.status in (200, 400)
    assert not any(basic(GIT_USER, GIT_TOKEN) in h for h in world.thief.authorizations), world.thief.authorizations


async def test_setup_and_agent_never_see_the_git_credential_or_the_hosts_secrets(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    words = (GIT_TOKEN, basic(GIT_USER, GIT_TOKEN), HOST_SECRET)
    pattern = " ".join(f"-e {split(w)}" for w in words)
    ws = {"git": world.git_server.url("private.git"), "credential": "ci",
          "setup": ["env > .setup-env", "git config --list --show-origin > .setup-git 2>&1; true"]}
    thread = unique("cred-thr-")
    _, seen = await ok_turn(a, gw, thread,
                            f"run grep -c {pattern} .setup-env .setup-git .git/config; echo GREP-DONE\n"
                            f"run env | grep -c {pattern}; echo ENV-DONE\n"
                            "run cat README.md", ws)
    assert "hello" in seen  # the clone with the credential worked
    assert basic(GIT_USER, GIT_TOKEN) in " ".join(world.git_server.authorizations)
    assert ".setup-env:0" in seen and ".setup-git:0" in seen and ".git/config:0" in seen, seen
    assert "0\nENV-DONE" in seen, seen
    assert not any(s in seen for s in SECRETS)


async def test_a_setup_command_cannot_read_the_hosts_environment_or_credentials_file(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    """A setup command's parent is the sandbox's daemon (whose environment holds neither the
    host's secrets nor where its credentials file is), not the host. (Still the host's user on
    a local sandbox: no isolation, docs/overview.md; docker is the isolated provider.)"""
    words = (GIT_TOKEN, HOST_SECRET)
    steal = ("tr '\\0' '\\n' < /proc/$PPID/environ > .leak; "
             "cat \"$(sed -n 's/^BATON_GIT_CREDENTIALS_FILE=//p' .leak)\" >> .leak; true")
    ws = {"git": f"file://{world.repo.bare}", "setup": [steal]}
    thread = unique("steal-thr-")
    _, seen = await ok_turn(a, gw, thread, "".join(f"run grep -c -e {split(w)} .leak; echo W{i}\n" for i, w in enumerate(words))
                            + "run rm -f .leak", ws)
    kept(await a.delete(f"{gw.url}/api/threads/{thread}"))
    assert "0\nW0" in seen and "0\nW1" in seen, seen


# --- the snapshot and its restore -----------------------------------------------------------


def accepted(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(next(c for c in chunks if c.get("name") == "run.accepted")["value"])


async def test_symlinks_out_of_the_tree_are_not_kept_and_host_files_never_come_back(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("links-thr-")
    _, seen = await ok_turn(a, gw, thread, "run ./tool.sh; cat inside", {"git": f"file://{world.tricks}"})
    assert "EXEC-OK" in seen and "hello" in seen
    chill(cluster, thread)
    _, seen = await ok_turn(a, gw, thread, "run ls -A; echo LS-END\nrun cat passwd climb inside 2>&1; ./tool.sh")
    listing = seen.split("LS-END")[0]
    assert "inside" in listing and "tool.sh" in listing
    assert "passwd" not in listing and "climb" not in listing  # skipped by the snapshot
    assert "root:" not in seen  # no host file read through a restored link
    assert "EXEC-OK" in seen and "hello" in seen


async def test_a_link_from_work_into_the_thread_root_does_not_brick_the_thread(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("up-thr-")
    await ok_turn(a, gw, thread, "run ln -s .. up; ln -s ../home homelink; echo made", {"git": f"file://{world.repo.bare}"})
    chill(cluster, thread)
    run_id, chunks = await turn(a, gw, thread, "claude-code", "run ls -A")
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)


async def test_thousands_of_files_deep_dirs_modes_and_type_swaps_survive_cold_restores(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("tree-thr-")
    deep = "/".join(["d"] * 60)
    await ok_turn(a, gw, thread, "\n".join([
        "run mkdir many && cd many && i=0; while [ $i -lt 3000 ]; do echo $i > f$i; i=$((i+1)); done; echo MADE",
        f"run mkdir -p {deep} && echo DEEP-LEAF > {deep}/leaf",
        "run printf '#!/bin/sh\\necho EXEC-OK\\n' > tool.sh && chmod 755 tool.sh && chmod 600 README.md",
        "run mkdir swap1 && echo in > swap1/inner; echo file > swap2",
        "run touch \"$(printf 'new\\nline')\" 'ünï©ødé ☃.txt' ' lead space' -- '-dash'",
    ]), {"git": f"file://{world.repo.bare}"})
    chill(cluster, thread)
    _, seen = await ok_turn(a, gw, thread, "\n".join([
        "run find many -type f | wc -l; cat many/f2999; echo COUNT-END",
        f"run cat {deep}/leaf; ./tool.sh; stat -c %a README.md tool.sh",
        "run test -f \"$(printf 'new\\nline')\" && test -f 'ünï©ødé ☃.txt' && test -f ' lead space' "
        "&& test -f ./-dash && echo NAMES-OK",
        "run rm -rf swap1 && echo NOW-A-FILE > swap1; rm swap2 && mkdir swap2 && echo NOW-A-DIR > swap2/in",
    ]))
    assert "3000\n2999\nCOUNT-END" in seen, seen
    assert "DEEP-LEAF" in seen and "EXEC-OK" in seen and "600\n755" in seen, seen
    assert "NAMES-OK" in seen, seen
    chill(cluster, thread)
    _, seen = await ok_turn(a, gw, thread, "run cat swap1 swap2/in; test -d swap2 && test -f swap1 && echo SWAP-OK")
    assert "NOW-A-FILE\nNOW-A-DIR\nSWAP-OK" in seen, seen

    # A turn that deletes everything: the next turn, cold, sees an empty workspace.
    await ok_turn(a, gw, thread, "run rm -rf ./* ./.[!.]* && ls -A | wc -l")
    chill(cluster, thread)
    _, seen = await ok_turn(a, gw, thread, "run echo BEGIN; ls -A; echo END")
    assert between(seen, "BEGIN", "END").strip() == "", seen


async def test_a_turn_that_removes_its_working_directory_is_not_lost_silently(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("rmwd-thr-")
    await ok_turn(a, gw, thread, "write old.txt OLD", {"git": f"file://{world.repo.bare}"})
    gone, _ = await ok_turn(a, gw, thread, "run rm -rf \"$PWD\"; echo removed")
    _, chunks = await turn(a, gw, thread, "claude-code", "run echo BEGIN; ls -A; echo END")
    lost = accepted(chunks).get("previousTurnLost")
    empty = between(texts(chunks), "BEGIN", "END").strip() == ""
    assert empty or (lost is not None and lost["runId"] == gone), (lost, texts(chunks))


async def test_a_file_name_that_is_not_utf8_never_wedges_the_run(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("bytes-thr-")
    await ok_turn(a, gw, thread, "write kept.txt KEPT", {"git": f"file://{world.repo.bare}"})
    made = unique("run-")
    body = chat_body(thread, "claude-code", "run touch \"$(printf 'bad\\377name')\" && echo MADE",
                     await history(a, gw, thread))
    work = cluster.tmp / "sandboxes" / "threads" / file_stem(thread) / "work"
    try:
        async with asyncio.timeout(45):
            got = await read_stream(a, "POST", f"{gw.url}/api/chat?runId={made}", json=body)
        assert got.ended and terminal([c for _, c in got.events])["type"] == "RUN_FINISHED"
    finally:
        # Unwedge the run for the tests after this one: without the name, the next
        # takeover's snapshot succeeds and the log closes.
        for p in work.iterdir():
            if p.name.startswith("bad"):
                p.unlink()
        got = await read_stream(a, "GET", f"{gw.url}/api/chat", params={"runId": made, "offset": "-1"})
        assert got.ended


# --- races ----------------------------------------------------------------------------------


async def test_delete_while_a_run_goes_is_refused_and_forks_race_cleanly(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("race-thr-")
    run1, _ = await ok_turn(a, gw, thread, "write one.txt ONE", {"git": f"file://{world.repo.bare}"})
    before = await history(a, gw, thread)

    # Turn 2 is going (a client read its start and left).
    run2 = unique("run-")
    body = chat_body(thread, "claude-code", "sleep 3\nwrite two.txt TWO", before)
    first = await read_stream(a, "POST", f"{gw.url}/api/chat?runId={run2}", json=body, stop_after=2,
                              headers={"Authorization": f"Bearer {KEY_A}"})
    assert first.status == 200
    busy = kept(await a.delete(f"{gw.url}/api/threads/{thread}"))
    assert busy.status_code == 409 and busy.json()["reason"] == "THREAD_BUSY", busy.text
    assert busy.json()["activeRunId"] == run2

    # Forks at run 1 while run 2 goes: two to the same new id at once, one wins.
    fork = unique("fork-")
    both = await asyncio.gather(*(a.post(f"{gw.url}/api/threads/{thread}/fork", json={"runId": run1, "newThreadId": fork})
                                  for _ in range(2)))
    for r in both:
        kept(r)
    assert sorted(r.status_code for r in both) == [201, 409], [r.text for r in both]

    got = await read_stream(a, "GET", f"{gw.url}/api/chat", params={"runId": run2, "offset": "-1"})
    assert got.ended and terminal([c for _, c in got.events])["type"] == "RUN_FINISHED"
    _, seen = await ok_turn(a, gw, fork, "run cat one.txt; ls")
    assert "ONE" in seen and "two.txt" not in seen
    _, seen = await ok_turn(a, gw, thread, "run cat one.txt two.txt")
    assert "ONE\nTWO" in seen
    assert kept(await a.delete(f"{gw.url}/api/threads/{thread}")).status_code == 204


async def test_a_host_killed_while_it_snapshots_leaves_a_good_head(
        world: World, cluster: AttackCluster, gw: Gateway, a: httpx.AsyncClient) -> None:
    thread = unique("kill-thr-")
    await ok_turn(a, gw, thread, "write base.txt BASE", {"git": f"file://{world.repo.bare}"})
    # Turn 2 leaves 24 MB of random bytes: its snapshot takes a while; its host dies as soon
    # as the client reads RUN_FINISHED (the snapshot is the next final write).
    run2 = unique("run-")
    body = chat_body(thread, "claude-code", "run head -c 24000000 /dev/urandom > big.bin; sha256sum big.bin",
                     await history(a, gw, thread))
    victim, summed = None, ""
    async with a.stream("POST", f"{gw.url}/api/chat?runId={run2}", json=body) as resp:
        async for item in aiter_sse(resp.aiter_bytes()):
            if isinstance(item, Comment):
                continue
            chunk = json.loads(item.data)
            if chunk["type"] == "TOOL_CALL_RESULT":
                summed = str(chunk.get("content"))
            if chunk["type"] == "RUN_STARTED":
                victim = await driver_of(a, gw, run2)
            if chunk["type"] == "RUN_FINISHED":
                assert victim is not None
                await cluster.kill(victim)
                break
    await cluster.add_host()
    got = await read_stream(a, "GET", f"{gw.url}/api/chat", params={"runId": run2, "offset": "-1"})
    assert got.ended

    chill(cluster, thread)
    _, chunks = await turn(a, gw, thread, "claude-code", "run cat base.txt; sha256sum big.bin 2>&1")
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    seen, lost = texts(chunks), accepted(chunks).get("previousTurnLost")
    assert "BASE" in seen
    digest = summed.split()[0] if summed else "?"
    assert digest in seen or (lost is not None and lost["runId"] == run2), (summed, lost, seen)


# --- secrets, after all that ----------------------------------------------------------------


async def test_no_secret_anywhere(cluster: AttackCluster, records: Records, nats: Any, world: World) -> None:
    from baton.workspaces import WorkspaceConfig, WorkspaceStore
    import nats as nats_py

    found = files_holding(cluster.tmp / "logs", SECRETS) + files_holding(cluster.tmp / "journals", SECRETS)
    found += [f"log record: {n}" for line in records.lines for n in SECRETS if n in line]
    found += [f"error body: {n}" for body in BODIES for n in SECRETS if n in body]
    found += await jetstream_holding(nats.url, SECRETS)
    # Every thread head's workspace, restored (packs are compressed: read them as a restore does).
    nc = await nats_py.connect(nats.url)
    try:
        cfg = WorkspaceConfig.from_env({k: v for k, v in cluster.settings.items() if k.startswith("BATON_WORKSPACE_")})
        store = WorkspaceStore(nc, cfg)
        kv = await nc.jetstream().key_value(cluster.settings["BATON_WORKSPACE_HEADS"])
        try:
            keys = await kv.keys()
        except nats_errors.NoKeysError:  # run alone: no turn of this module left a head
            keys = []
        for key in keys:
            head = json.loads((await kv.get(key)).value or b"{}")
            if head.get("snapshot"):
                tar = await store.restore_tar(head["snapshot"])
                found += [f"workspace of {key}: {n}" for n in SECRETS if n.encode() in tar]
    finally:
        await nc.close()
    assert found == []
