"""README.md's code blocks, run as written against a cluster that ``baton up`` started.

Every fenced block in the README has a marker on the line right before it:

- ``<!-- readme-test: NAME -->``: executed here, in document order, as a newcomer would run
  it (``sh``: bash with ``-e -o pipefail``; ``python``: a file run with the venv's python),
  with the working directory and ``PATH`` (the venv's ``bin`` first) of someone who ran
  ``baton up`` in it. ``EXPECT[NAME]`` says what the user would look for in its output;
- ``<!-- readme-test: skip (reason) -->``: not executed, for the reason given.

A block with neither fails :func:`test_every_block_is_marked`. The only change made to a
snippet is the gateway's host:port, and only when 8080/8081 are taken on this machine.
Snippets may depend on earlier ones (``baton tail r1`` reads the run the curl started), as
the README is read top to bottom; the last one runs ``baton down``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from baton_tools.testing.servers import env_without_proxy, port_is_free
from tests.conftest import eventually, require

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TS_CLIENT = REPO / "clients" / "typescript"
# The venv's own bin (not resolved: .venv/bin/python is a symlink to the base interpreter).
VENV_BIN = pathlib.Path(sys.executable).parent
HTTP, GRPC = "127.0.0.1:8080", "127.0.0.1:8081"  # what `baton up` prints, and the README uses
# Per snippet. The ops one runs six CLI commands, each a new Python process (about 0.5 s of
# CPU), `baton down` stopping the cluster last: 17 s at load 6, past 60 s at load 15-20 on
# two cores. A budget for a loaded machine, not a speed target.
SNIPPET_TIMEOUT = 150.0

MARKER = re.compile(r"^<!-- readme-test: (?:skip \((?P<reason>[^)]+)\)|(?P<name>[a-z0-9-]+)) -->$")
FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w-]*)\s*$")

#: What a user checks in each executed snippet's output (all must appear).
EXPECT: dict[str, list[str]] = {
    "curl-start": ['data: {"type":"RUN_STARTED","threadId":"t1","runId":"r1"}', '"type":"RUN_FINISHED"', ": end"],
    "curl-join": ['"runId":"r1"', '"type":"RUN_FINISHED"', ": end", '"status":"completed"', '"role":"assistant"'],
    "python-client": ["RUN_STARTED", "RUN_FINISHED", "\ncompleted\n", "assistant "],
    "claude-curl": ['"type":"RUN_STARTED","threadId":"c-thread","runId":"c1"', '"type":"TEXT_MESSAGE_CONTENT"',
                    '"type":"RUN_FINISHED"', ": end"],
    "baton-run": ["completed: run", "thread c-thread", "continue it: baton run --thread"],
    "typescript-client": ["RUN_STARTED", "RUN_FINISHED", "\ncompleted\n"],
    "ops": ["r1", "r2", "completed", "stopped"],
}
#: The README's example repository; the snippets run against a local one (no network here).
EXAMPLE_REPO = "https://github.com/you/your-repo.git"


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: its marker (``name`` or ``skip`` reason), language, text, line."""

    line: int
    lang: str
    code: str
    name: str | None
    skip: str | None


def parse_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the marker on the line before its fence.

    Raises:
        ValueError: a fence is never closed.
    """
    lines = text.split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, fence = i, m["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"README.md:{start + 1}: unclosed code block")
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        out.append(Block(start + 1, m["lang"], "\n".join(lines[start + 1:end]) + "\n",
                         marker["name"] if marker else None, marker["reason"] if marker else None))
        i = end + 1
    return out


BLOCKS = parse_blocks(README.read_text(encoding="utf-8"))
EXECUTED = [b for b in BLOCKS if b.name]


def test_every_block_is_marked() -> None:
    unmarked = [f"README.md:{b.line}" for b in BLOCKS if not (b.name or b.skip)]
    assert unmarked == [], "put <!-- readme-test: NAME --> or <!-- readme-test: skip (reason) --> before each"
    names = [b.name for b in EXECUTED]
    assert len(names) == len(set(names)), names
    assert sorted(names) == sorted(EXPECT), "every executed snippet needs what its user checks in EXPECT"
    assert all(b.lang in ("sh", "python", "ts") for b in EXECUTED), [(b.name, b.lang) for b in EXECUTED]


def test_parse_blocks_reads_markers() -> None:
    text = ("<!-- readme-test: a-b -->\n```sh\necho hi\n```\n\n"
            "<!-- readme-test: skip (why not) -->\n```python\nx\n```\n```\nbare\n```\n")
    got = parse_blocks(text)
    assert [(b.name, b.skip, b.lang, b.code) for b in got] == [
        ("a-b", None, "sh", "echo hi\n"), (None, "why not", "python", "x\n"), (None, None, "", "bare\n")]


@dataclasses.dataclass
class Up:
    """The cluster of ``baton up`` run in ``cwd``, as the README's reader has it."""

    cwd: pathlib.Path
    env: dict[str, str]
    http: str
    grpc: str

    repo: str = ""

    def rewrite(self, code: str) -> str:
        """The snippet with the gateway's address of this cluster and the local repository in
        place of the example URL (nothing else changes)."""
        return code.replace(HTTP, self.http).replace(GRPC, self.grpc).replace(EXAMPLE_REPO, self.repo)


def _wait_ready(proc: subprocess.Popen[bytes], cwd: pathlib.Path, log: pathlib.Path, timeout: float) -> dict[str, object]:
    """``cluster.json`` of the ``baton up`` in ``proc`` once it printed ``ready``."""
    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"baton up exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        return "ready:" in log.read_text(errors="replace")
    try:
        eventually(ready, timeout, "baton up printed no ready line", interval=0.1)
    except TimeoutError as exc:
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')}")
    info: dict[str, object] = json.loads((cwd / ".data" / "cluster" / "cluster.json").read_text())
    return info


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``baton up`` in a fresh directory, in the background; ``baton down`` at the end."""
    cwd = tmp_path_factory.mktemp("readme")
    env = env_without_proxy()
    # A newcomer's shell: no key, no cluster of another test (baton up without BATON_API_KEYS: no auth).
    for name in ("BATON_API_KEYS", "BATON_API_KEY", "BATON_URL", "BATON_INTERNAL_TOKEN", "BATON_COORDINATOR"):
        env.pop(name, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    # "export ANTHROPIC_API_KEY=… ; baton up" with the stand-in CLIs (no model is reachable
    # here) and a local repository the hosts may clone (BATON_WORKSPACE_DIRS).
    from baton_tools.standins import STANDINS_DIR
    from tests.sandbox.gitrepos import make_repo

    env["PATH"] = f"{VENV_BIN}{os.pathsep}{STANDINS_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["ANTHROPIC_API_KEY"] = "sk-ant-test"
    repos = cwd / "repos"
    repos.mkdir()
    repo = make_repo(repos, "your-repo.git")
    env["BATON_WORKSPACE_DIRS"] = str(repos.resolve())
    port = 8080 if port_is_free(8080) and port_is_free(8081) else 0
    log = cwd / "baton-up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(VENV_BIN / "baton"), "up", "--port", str(port)], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        info = _wait_ready(proc, cwd, log, timeout=90.0)
        ports = info["ports"]
        assert isinstance(ports, dict)
        yield Up(cwd, env, f"127.0.0.1:{ports['gateway']}", f"127.0.0.1:{ports['gateway-grpc']}",
                 f"file://{repo.bare.resolve()}")
    finally:
        if proc.poll() is None:
            subprocess.run([str(VENV_BIN / "baton"), "down"], cwd=cwd, env=env, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.servers
@pytest.mark.timeout(300)  # the first includes `baton up` (90 s at most), then SNIPPET_TIMEOUT
@pytest.mark.parametrize("block", EXECUTED, ids=[b.name or "" for b in EXECUTED])
def test_snippet_runs_as_written(up: Up, block: Block) -> None:
    code = up.rewrite(block.code)
    if block.lang == "python":
        script = up.cwd / f"{block.name}.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    elif block.lang == "ts":
        # Plain JavaScript is TypeScript too: node runs the snippet as a module, with the
        # repository's package as `@baton-runs/client` (built by `make ts-client`).
        require(shutil.which("node"), "the README's TypeScript snippet needs node")
        require((TS_CLIENT / "dist" / "index.js").exists(), "clients/typescript is not built: make ts-client")
        scope = up.cwd / "node_modules" / "@baton-runs"
        scope.mkdir(parents=True, exist_ok=True)
        if not (scope / "client").exists():
            (scope / "client").symlink_to(TS_CLIENT)
        script = up.cwd / f"{block.name}.mjs"
        script.write_text(code)
        argv = ["node", str(script)]
    else:
        require(shutil.which("curl") or "curl " not in code, "the README's curl snippets need curl")
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    done = subprocess.run(argv, cwd=up.cwd, env=up.env, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT)
    shown = f"README.md:{block.line} ({block.name}) exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, shown
    missing = [want for want in EXPECT[str(block.name)] if want not in done.stdout]
    assert missing == [], shown
