"""Helpers for the CLI tests: run `baton` as a real process and find what it left behind."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from baton_tools.testing.servers import env_without_proxy
from tests.conftest import process_state

REPO = pathlib.Path(__file__).resolve().parents[2]


def baton_argv(*args: str) -> list[str]:
    """argv running the CLI with this interpreter (the console script may not be installed)."""
    return [sys.executable, "-m", "baton_tools.cli", *args]


def cli_env(**extra: str) -> dict[str, str]:
    env = env_without_proxy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # Wide enough that rich does not wrap table rows the tests read.
    env["COLUMNS"] = "220"
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 60.0, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(baton_argv(*args), capture_output=True, text=True, timeout=timeout, env=cli_env(**env), cwd=str(REPO))


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != b"Z":
            found.append((int(d.name), cmd))
    return found


def pid_alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z")


def cluster_json(data_dir: pathlib.Path) -> dict[str, Any] | None:
    try:
        info = json.loads((data_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("components") else None
