"""The launch wrapper: a POSIX ``sh`` script every provider runs around the agent.

docs/design.md §5.2. The wrapper

1. reads the exit-sentinel nonce from a file and deletes that file before the agent starts,
   so the nonce is never in the agent's environment, argv or file system (it lives only in
   an unexported shell variable of the wrapper). The file may add `` <attempt>`` (an agent
   process relaunched in the same run, :mod:`sandbox_host.agent_resume`): the wrapper then
   first appends ``{"__resume":<attempt>,"__nonce":"<nonce>","inbox":"<inbox>"}`` to the
   journal;
2. runs the agent with stdout **redirected** (``>>``, append, never a pipe: a dead host
   cannot SIGPIPE it) into the journal, stderr into its own file, stdin from a file (the
   prompt) or ``/dev/null``;
3. appends ``{"__exit":<code>,"__nonce":"<nonce>"}`` to the journal when the agent ends.

With an **inbox** (an interactive agent, docs/hitl.md), the agent's stdin is a FIFO fed by a
relay: first the stdin file, then every line appended to the inbox (``<id> <payload>``),
followed with ``tail -f`` (it wakes on an append through inotify; where it cannot, as on a
container's overlayfs, it polls every 0.05 s: ``bench/approvals.py`` measures both). The relay passes each input id once (a line whose id it has seen
is skipped, so two hosts appending the same input deliver it once), and for each it FIRST
appends ``{"type":"baton_input","id":"<id>","input":<payload>}`` to the journal, THEN writes
``<payload>`` to the agent: the journal shows the input at the place the agent got it. The id
``eof`` ends the relay, so the agent reads end-of-file. The relay is the FIFO's only writer
and ends with the agent (``tail --pid``); the wrapper waits for it before the sentinel, so
the sentinel stays the journal's last line.

It traps TERM/INT/HUP with a handler that only sets a flag (not ``''``, which children
would inherit as "ignored"), so a signal that lands before the agent starts stops it from
starting (sentinel 143), and a SIGTERM to the process group stops the agent while the wrapper survives
to write the sentinel with the agent's status (143); SIGKILL ends both and leaves no
sentinel, which the follower then reports as an incomplete journal.

The nonce file disappears only after the trap is installed, so a launcher that waits for
the file to vanish knows a SIGTERM from then on yields a sentinel.

Invocation (same for every provider; the docker provider copies the script into the
container)::

    sh <wrapper.sh> <journal> <stderr> <nonce file> <stdin file or ""> <inbox or ""> <argv...>

Exit codes of the wrapper itself: 97 when the nonce file is missing or malformed (the
agent is then not started).
"""
from __future__ import annotations

from typing import Sequence

WRAPPER_EXIT_BAD_NONCE = 97

_SCRIPT = r"""#!/bin/sh
# baton launch wrapper (sandbox_host/_wrapper.py). Args: journal stderr noncefile stdinfile inbox argv...
journal=$1; errfile=$2; noncefile=$3; stdinfile=$4; inbox=$5
shift 5
stopped=
trap 'stopped=1' TERM INT HUP
nonce=$(cat "$noncefile" 2>/dev/null)
rm -f "$noncefile"
attempt=
case $nonce in *" "*) attempt=${nonce#* }; nonce=${nonce%% *} ;; esac
case $nonce in ''|*[!0-9a-f]*) exit 97 ;; esac
case $attempt in *[!0-9]*) exit 97 ;; esac
# A relaunched agent process (docs/hitl.md): the marker goes first, before anything it writes.
[ -n "$attempt" ] && printf '{"__resume":%d,"__nonce":"%s","inbox":"%s"}\n' "$attempt" "$nonce" "$inbox" >>"$journal"
if [ -n "$stopped" ]; then
  # Signalled before the agent started: it never runs; report as a SIGTERM death.
  printf '{"__exit":%d,"__nonce":"%s"}\n' 143 "$nonce" >>"$journal"
  exit 0
fi
# The agent runs as a background job the wrapper waits for, so a signal the wrapper traps
# is forwarded at once (a group signal landing between fork and exec would be lost).
relay=
if [ -n "$inbox" ]; then
  fifo="$inbox.fifo"
  rm -f "$fifo"
  mkfifo -m 600 "$fifo" || exit 96
  "$@" <"$fifo" >>"$journal" 2>>"$errfile" &
  agent=$!
  # The relay: the FIFO's only writer (see the module's docstring).
  tail -n +1 -s 0.05 -f --pid="$agent" "$inbox" 2>/dev/null | {
    [ -n "$stdinfile" ] && cat "$stdinfile"
    seen=" "
    while IFS= read -r line; do
      id=${line%% *}
      payload=${line#* }
      [ "$id" = "$line" ] && continue
      case $seen in *" $id "*) continue ;; esac
      seen="$seen$id "
      [ "$id" = eof ] && break
      kill -0 "$agent" 2>/dev/null || break
      # A dead agent not reaped yet (a zombie) still answers kill -0: its state says it; no
      # state at all is one reaped since (between kill -0 and this read).
      case $(sed 's/.*) //' "/proc/$agent/stat" 2>/dev/null) in Z*|X*|'') break ;; esac
      # One write (the agent may be writing its own lines to the journal meanwhile): the line
      # is built first, then printed whole (dash splits a longer format's output at ~8 KiB).
      echoed="{\"type\":\"baton_input\",\"id\":\"$id\",\"input\":$payload}
"
      printf '%s' "$echoed" >>"$journal"
      printf '%s\n' "$payload" || break
    done
  } >"$fifo" 2>/dev/null &
  relay=$!
elif [ -n "$stdinfile" ]; then
  "$@" <"$stdinfile" >>"$journal" 2>>"$errfile" &
  agent=$!
else
  "$@" </dev/null >>"$journal" 2>>"$errfile" &
  agent=$!
fi
trap 'stopped=1; kill -TERM "$agent" 2>/dev/null' TERM INT HUP
resent=
while :; do
  if [ -n "$stopped" ] && [ -z "$resent" ]; then
    # A signal that reached the agent's process between fork and exec is lost there
    # (it still had our trap), so the whole group gets it again once the agent surely
    # runs (its own children included; the wrapper only notes it).
    resent=1
    kill -TERM "$agent" 2>/dev/null
    sleep 0.2
    kill -TERM 0 2>/dev/null
  fi
  wait "$agent"
  code=$?
  kill -0 "$agent" 2>/dev/null || break
done
if [ -n "$relay" ]; then
  # The relay ends within tail's 0.05 s check of the agent's end (or at once when it reads eof).
  wait "$relay" 2>/dev/null
  rm -f "$fifo"
fi
printf '{"__exit":%d,"__nonce":"%s"}\n' "$code" "$nonce" >>"$journal"
exit 0
"""


def wrapper_script() -> str:
    """The wrapper's source (POSIX ``sh``: ``cat``, ``rm``, ``sleep``, ``mkfifo``, GNU ``tail`` and the
    builtins ``printf``, ``kill``, ``wait``, ``read``)."""
    return _SCRIPT


def wrapper_argv(
    wrapper_path: str,
    journal: str,
    stderr: str,
    nonce_file: str,
    stdin_file: str | None,
    argv: Sequence[str],
    inbox: str = "",
) -> list[str]:
    """The command line that runs ``argv`` under the wrapper.

    Args:
        wrapper_path: where :func:`wrapper_script` was written in the sandbox.
        journal: the journal path (created/appended to).
        stderr: the agent's stderr file.
        nonce_file: a file holding the nonce (mode 0600); the wrapper deletes it.
        stdin_file: a file fed to the agent's stdin, or ``None`` for ``/dev/null``.
        argv: the agent's command line.
        inbox: the inbox file the relay follows ("" = none: stdin is the file alone).

    Raises:
        ValueError: when ``argv`` is empty.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    return ["sh", wrapper_path, journal, stderr, nonce_file, stdin_file or "", inbox, *argv]
