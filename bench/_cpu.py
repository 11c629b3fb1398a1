"""CPU use read from ``/proc`` (Linux), shared by the benches.

A process's ``/proc/<pid>/stat`` fields after its ``(comm)``: index 1 is the parent pid,
11 and 12 are user and system time in clock ticks (``proc(5)``).
"""
from __future__ import annotations

import os
import pathlib
import time
from typing import Callable, Iterator

TICK = os.sysconf("SC_CLK_TCK")  # clock ticks per second


def _fields(stat: str) -> list[str]:
    return stat.rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (every thread).

    Raises:
        OSError: no such process.
    """
    f = _fields(pathlib.Path(f"/proc/{pid}/stat").read_text())
    return (int(f[11]) + int(f[12])) / TICK


def cpu_seconds_exact(pid: int) -> float:
    """Seconds process ``pid``'s live threads have run on a CPU (the first field of each
    ``/proc/<pid>/task/<tid>/schedstat``, in ns): to the nanosecond, where
    :func:`cpu_seconds` counts 10 ms ticks. A thread that ended is not counted.

    Raises:
        OSError: no such process.
    """
    total = 0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
    return total / 1e9


def processes() -> Iterator[tuple[int, int, float, str]]:
    """Every live process as ``(pid, parent pid, CPU seconds so far, command line)``; one
    that ends while read is left out."""
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = _fields((d / "stat").read_text())
            argv = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(d.name), int(f[1]), (int(f[11]) + int(f[12])) / TICK, argv


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot (``/proc/stat``'s ``cpu`` line;
    idle and iowait are not busy)."""
    with open("/proc/stat") as fh:
        vals = [int(x) for x in fh.readline().split()[1:]]
    return sum(vals) - vals[3] - vals[4], sum(vals)


class CpuWindow:
    """The cores each process group used over a window: CPU seconds / wall seconds.

    Args:
        groups: group name → a callable giving its live pids (read at :meth:`start` and
            :meth:`stop`; a pid gone by then counts nothing).
    """

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self._groups = groups
        self._t0 = 0.0
        self._jiffies = (0, 0)
        self._cpu: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        out = {}
        for name, pids in self._groups.items():
            total = 0.0
            for pid in pids():
                try:
                    total += cpu_seconds(pid)
                except OSError:
                    continue
            out[name] = total
        return out

    def start(self) -> None:
        self._cpu, self._jiffies, self._t0 = self._read(), machine_jiffies(), time.monotonic()

    def stop(self) -> dict[str, float]:
        """``{group: cores used}`` plus ``machine_busy`` (0–1 of all cores) since :meth:`start`."""
        wall = max(time.monotonic() - self._t0, 1e-9)
        cpu, (busy, total) = self._read(), machine_jiffies()
        out = {name: round((cpu[name] - self._cpu.get(name, 0.0)) / wall, 2) for name in cpu}
        out["machine_busy"] = round((busy - self._jiffies[0]) / max(total - self._jiffies[1], 1), 2)
        return out


def calibration_ms(rounds: int = 5) -> float:
    """The machine's single-core speed as the fastest of ``rounds`` runs of a fixed
    pure-Python loop (ms, lower is faster): beside a bench's figures, it tells a slower day
    of a shared machine from a slower tree."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        sum(i * i for i in range(300_000))
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 2)

