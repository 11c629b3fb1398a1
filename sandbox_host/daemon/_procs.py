"""The agent's process tree inside a sandbox: launch it detached, signal it, see it alive.

The adapter of the daemon's process I/O (docs/design.md §5.2). The agent runs under the launch
wrapper (:mod:`sandbox_host._wrapper`) in its own session (``setsid``) whose parent exits at
once, so the agent is nobody's child: it outlives the daemon (a restarted daemon finds it by
its process group) and the host. The group leader records its own pid in ``<state>/pgid``
before it becomes the wrapper, so the group of a launch whose answer never reached the host
can still be signalled.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets as _secrets
import subprocess
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sandbox_host._wrapper import wrapper_argv, wrapper_script
from sandbox_host.daemon._files import open_regular, write_whole

# `setsid` (not forking, as it is not a group leader in a non-interactive sh) makes the child
# a session and group leader with pid == pgid; that child records its pid (first argument)
# and only then becomes the wrapper, while the launching sh prints the pid and exits. Written
# by the group leader itself, after `setsid`, the record never names a process not yet
# leading its group. When the state directory was removed meanwhile, the record cannot be
# written and no agent starts (`&&`). The pid comes back through a pipe that only the
# launching sh holds: it is spawned with every other descriptor closed, and its child's
# output goes to /dev/null (under uvloop's spawn, which closes nothing, the pipe's end
# reached the agent, and reading the pipe to its end waited for the agent's exit).
_LAUNCHER = ('f=$1; shift; setsid sh -c \'echo $$ >"$0" && exec "$@"\' "$f" "$@" '
             '</dev/null >/dev/null 2>&1 & echo $!')
PGID_FILE = "pgid"
#: The daemon's own settings, never handed to the agent.
_PRIVATE_PREFIXES = ("BATON_INTERNAL_TOKEN", "BATON_TLS_", "BATON_SANDBOX_DAEMON_")
#: Names (comma-separated) of further variables the daemon's starter set for the daemon alone
#: (a ``PYTHONPATH``, say): they do not reach the agent either.
OWN_ENV = "BATON_SANDBOX_DAEMON_OWN_ENV"
_PROXY_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "no_proxy", "NO_PROXY")


class LaunchFailed(RuntimeError):
    """The launcher misbehaved; the message holds no secret."""


@dataclass(frozen=True)
class LaunchSpec:
    """One launch (see ``LaunchRequest`` in protos/baton/v1/sandbox_daemon.proto).

    Attributes:
        secrets: environment never logged (excluded from ``repr``).
    """

    argv: Sequence[str]
    nonce: str
    journal_path: str
    stderr_path: str
    workdir: str
    stdin: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    interactive: bool = False
    home: str = ""


def agent_env(base: Mapping[str, str], spec: LaunchSpec) -> dict[str, str]:
    """The agent's environment: ``base`` (the daemon's) less the daemon's credentials and
    proxies, ``LANG`` defaulted, the home's variables, then ``spec.env`` and ``spec.secrets`` (pure)."""
    own = set(filter(None, base.get(OWN_ENV, "").split(",")))
    out = {k: v for k, v in base.items()
           if not k.startswith(_PRIVATE_PREFIXES) and k not in _PROXY_ENV and k not in own}
    out.setdefault("LANG", "C.UTF-8")
    if spec.home:
        # The thread's own home: the agent's session store (~/.claude, $CODEX_HOME) stays
        # where its next turn looks for it.
        out.update(HOME=spec.home, CODEX_HOME=os.path.join(spec.home, ".codex"))
    out.update(spec.env)
    out.update(spec.secrets)
    for k in _PROXY_ENV:
        out.pop(k, None)
    return out


async def launch(state_dir: str, spec: LaunchSpec, *, base_env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Start the agent under the wrapper in a new session: ``(pgid, inbox path or "")``.

    The journal and stderr file are created (empty) first, so an attach preflight sees them
    at once. Returns once the group leader has installed its traps (it deleted the nonce
    file) or ended; does not wait for the agent.

    Args:
        state_dir: where the wrapper, nonce, stdin, inbox and pgid files go.
        spec: what to start.
        base_env: the environment the agent's starts from (:func:`agent_env`); default
            this process's.

    Raises:
        LaunchFailed: the launcher wrote no pid.
        ValueError: an argument or a variable holds NUL, or a variable's name ``=``.
        OSError: the state directory or the journal's directory is not writable, or the
            working directory does not exist.
    """
    wrapper = os.path.join(state_dir, "wrapper.sh")
    tag = _secrets.token_hex(8)
    nonce_file = os.path.join(state_dir, f"nonce-{tag}")
    stdin_file = os.path.join(state_dir, f"stdin-{tag}") if spec.stdin is not None else None
    inbox = os.path.join(state_dir, f"inbox-{tag}") if spec.interactive else ""

    def prepare() -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        # Whole, under a new name, then renamed: never through a link or into a FIFO an
        # agent of an earlier launch put there (an open would wait for a reader for good).
        write_whole(wrapper, wrapper_script().encode(), 0o644)
        fd = os.open(nonce_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(spec.nonce)
        if stdin_file is not None:
            fd = os.open(stdin_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(spec.stdin or b"")
        if inbox:
            fd = os.open(inbox, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)  # empty: the relay follows it from its first line
        for p in (spec.journal_path, spec.stderr_path):  # the same: a regular file, or refused
            os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
            os.close(open_regular(p, no_link=True, append=True, create=True))

    cmd = wrapper_argv(wrapper, spec.journal_path, spec.stderr_path, nonce_file, stdin_file, spec.argv, inbox)
    argv = ["sh", "-c", _LAUNCHER, "baton-launch", os.path.join(state_dir, PGID_FILE), *cmd]

    def start() -> tuple[int, bytes]:
        # subprocess, not the event loop's: uvloop (the host's loop) closes no descriptor
        # in the child (its close_fds is not implemented) and checks no argument for NUL,
        # so descriptors of the host reached the agent, and a NUL cut an argument short.
        with subprocess.Popen(argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True) as p:
            out, _ = p.communicate()  # the launching sh exits at once (its child is detached)
            return p.returncode, out

    def discard() -> None:
        # A launch that failed leaves none of its files: the nonce above all, which the
        # wrapper would have deleted (an agent that read it could forge the exit sentinel).
        for path in (nonce_file, stdin_file, inbox):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    try:
        env = agent_env(os.environ if base_env is None else base_env, spec)
        await asyncio.to_thread(prepare)
        returncode, out = await asyncio.to_thread(start)
        try:
            pgid = int(out.strip())
        except ValueError:
            raise LaunchFailed(f"launcher printed {out[-200:]!r} (exit {returncode})") from None
    except BaseException:
        discard()
        raise
    # The sh printed the pid right after fork; wait until the wrapper has deleted the nonce
    # file (so it is a group leader with its TERM trap installed) or ended, so kill and
    # status act on the group at once. (One small /proc read per poll.)
    for _ in range(5000):
        st = proc_stat(pgid)
        if st is None or st[0] == "Z" or (st[1] == pgid and not os.path.exists(nonce_file)):  # noqa: ASYNC240 -- one stat, see above
            break
        await asyncio.sleep(0.001)
    return pgid, inbox


def recorded_pgid(state_dir: str) -> int | None:
    """The group the last launch recorded in ``<state>/pgid``, ``None`` when none did.

    The agent can write that file: it is read without waiting (a FIFO or a link there is
    no record), and a group that cannot be the agent's (1 or below, or this process's own:
    the launch starts the agent in a session of its own) is none either, so a ``kill`` or
    ``destroy`` of a sandbox never signals the process that reads it.
    """
    try:
        fd = open_regular(os.path.join(state_dir, PGID_FILE), no_link=True)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
        return None
    try:
        raw = os.read(fd, 32)
    finally:
        os.close(fd)
    try:
        pgid = int(raw.strip())
    except ValueError:
        return None
    return pgid if _may_be_agents(pgid) else None


def _may_be_agents(pgid: int) -> bool:
    return pgid > 1 and pgid != os.getpgrp()


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgrp)`` of a process from ``/proc``, ``None`` when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may contain spaces and parentheses: fields restart after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2])


def leader_alive(pgid: int) -> bool:
    """Whether group ``pgid``'s leader runs (not a zombie, still in its group): one small
    ``/proc`` read, the common answer of :func:`group_alive`."""
    st = proc_stat(pgid)
    return st is not None and st[0] != "Z" and st[1] == pgid


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in process group ``pgid``.

    ``killpg(pgid, 0)`` is not enough: detached agents are reparented to PID 1, which may
    not reap them, and a zombie still "exists" for kill.
    """
    if leader_alive(pgid):
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st is not None and st[1] == pgid and st[0] != "Z":
            return True
    return False


def signal_group(pgid: int | None, signal: int) -> bool:
    """Signal group ``pgid`` when it has a live member; ``True`` when it was signalled
    (``signal`` 0: when it has one). Blocking (scans ``/proc``): call it in a thread."""
    if not pgid or not _may_be_agents(pgid) or not group_alive(pgid):
        return False
    if signal == 0:
        return True
    try:
        os.killpg(pgid, signal)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def append_line(inbox: str, line: bytes) -> None:
    """Append ``line`` to ``inbox`` in one ``O_APPEND`` write (a regular file: not split),
    never through a symbolic link and never waiting in the ``open`` (a FIFO the agent put
    there held it, and the thread it ran in, for good).

    Raises:
        FileNotFoundError: no such inbox.
        PermissionError: a symbolic link, or not a regular file (a directory too), at ``inbox``.
    """
    try:
        fd = open_regular(inbox, no_link=True, append=True)
    except IsADirectoryError:
        raise PermissionError(f"{inbox} is not a regular file: not written") from None
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


__all__ = ["LaunchFailed", "LaunchSpec", "OWN_ENV", "PGID_FILE", "agent_env", "append_line", "group_alive", "launch",
           "proc_stat", "recorded_pgid", "signal_group"]
