"""The nemesis's schedule: which fault, on what, when and for how long (pure).

From a seed, :func:`draw` makes a random schedule over a number of minutes for a given
:class:`Topology`; :func:`shrink` cuts a failing schedule down to a minimal one that still
fails (delta debugging over the faults); :func:`dumps` / :func:`loads` store it as JSON
(a failing history's file, a replay with ``NEMESIS_SCHEDULE``).

Fault kinds (:data:`KINDS`), each on a *target* (a process name such as ``host-1``,
``coordinator-0``, ``etcd-2``, ``nats-0``, ``gateway``) or a *link* ``a->b`` (``b`` serves
``a``: ``host-1->nats-2``):

- ``kill``: SIGKILL, restarted after ``duration`` seconds;
- ``pause``: SIGSTOP, SIGCONT after ``duration``;
- ``restart``: SIGTERM (a host drains its runs) and a start at once;
- ``partition``: the link carries nothing for ``duration`` (``oneway``: only the
  ``direction`` given, ``up`` = a→b or ``down`` = b→a, is held);
- ``latency``: each byte on the link is held ``param`` seconds for ``duration``;
- ``reset``: every connection of the link is reset, and new ones refused, for
  ``duration`` (lossy link: the loss TCP cannot hide);
- ``skew``: the process's wall clock is moved by ``param`` seconds for ``duration``
  (libfaketime; ``jump``: moved and left there);
- ``disk_full``: the JetStream store of a NATS node has no space left for ``duration``.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

KINDS = ("kill", "pause", "restart", "partition", "latency", "reset", "skew", "disk_full")


@dataclass(frozen=True)
class Topology:
    """The cluster a schedule is drawn for.

    Attributes:
        etcd, nats, coordinators, hosts: how many of each process.
        kinds: the fault kinds this machine can inject (e.g. no ``disk_full`` without root).
    """

    etcd: int = 3
    nats: int = 3
    coordinators: int = 2
    hosts: int = 3
    kinds: tuple[str, ...] = KINDS

    @property
    def processes(self) -> list[str]:
        """Every process name, in a stable order."""
        return ([f"etcd-{i}" for i in range(self.etcd)] + [f"nats-{i}" for i in range(self.nats)]
                + [f"coordinator-{i}" for i in range(self.coordinators)]
                + [f"host-{i}" for i in range(self.hosts)] + ["gateway"])

    @property
    def links(self) -> list[str]:
        """Every link ``client->server`` the cluster routes through a proxy."""
        out = [f"coordinator-{c}->etcd-{e}" for c in range(self.coordinators) for e in range(self.etcd)]
        for h in range(self.hosts):
            out += [f"host-{h}->coordinator-{c}" for c in range(self.coordinators)]
            out += [f"host-{h}->nats-{n}" for n in range(self.nats)]
        out += [f"gateway->coordinator-{c}" for c in range(self.coordinators)]
        out += [f"gateway->nats-{n}" for n in range(self.nats)]
        return out


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule.

    Attributes:
        at: seconds from the schedule's start.
        kind: one of :data:`KINDS`.
        target: a process name or a link ``a->b``.
        duration: seconds the fault lasts (0 for ``restart``).
        param: ``latency``: seconds held; ``skew``: seconds the clock moves (signed).
        direction: ``partition``: ``both``, ``up`` (a→b held) or ``down`` (b→a held);
            ``skew``: ``back`` (the clock returns at the end) or ``jump`` (it stays).
    """

    at: float
    kind: str
    target: str
    duration: float = 0.0
    param: float = 0.0
    direction: str = ""

    @property
    def end(self) -> float:
        return self.at + self.duration

    def describe(self) -> str:
        extra = {"latency": f" {self.param * 1000:.0f}ms", "skew": f" {self.param:+.0f}s {self.direction}",
                 "partition": f" {self.direction}"}.get(self.kind, "")
        return f"t={self.at:.1f}s {self.kind}{extra} {self.target} for {self.duration:.1f}s"


@dataclass
class Schedule:
    """A seed's faults, ordered by start time."""

    seed: int
    minutes: float
    faults: list[Fault] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]


#: At most this many faults at once (a cluster with every process down tests nothing).
MAX_CONCURRENT = 2
#: Seconds between the starts of two faults (uniform).
GAP = (4.0, 14.0)


def draw(seed: int, minutes: float, topology: Topology = Topology()) -> Schedule:
    """A random schedule of faults over ``minutes``, the same for the same arguments.

    Faults never overlap on one target, at most :data:`MAX_CONCURRENT` run at once, a
    quorum is kept (at most one etcd member and one NATS node faulted at a time: the
    guarantees are promised for a majority up), and none starts in the last 20 s (the
    runs' ends are checked after a calm tail).

    Args:
        seed: the random seed.
        minutes: the schedule's length.
        topology: the cluster's processes and the kinds this machine can inject.

    Returns:
        The schedule, faults ordered by ``at``.
    """
    rng = random.Random(seed)
    total = minutes * 60.0
    kinds = [k for k in KINDS if k in topology.kinds]
    faults: list[Fault] = []
    t = rng.uniform(*GAP) / 2
    while t < total - 20.0 and kinds:
        f = _one(rng, t, kinds, topology)
        if f is not None and _fits(f, faults):
            faults.append(f)
        t += rng.uniform(*GAP)
    return Schedule(seed, minutes, faults)


def _one(rng: random.Random, at: float, kinds: Sequence[str], topo: Topology) -> Fault | None:
    kind = rng.choice(kinds)
    duration = round(rng.uniform(2.0, 12.0), 1)
    at = round(at, 1)
    if kind in ("kill", "pause"):
        return Fault(at, kind, rng.choice(topo.processes), duration)
    if kind == "restart":
        return Fault(at, kind, rng.choice(topo.processes))
    if kind == "partition":
        return Fault(at, kind, rng.choice(topo.links), duration, direction=rng.choice(("both", "up", "down")))
    if kind == "latency":
        return Fault(at, kind, rng.choice(topo.links), duration, param=round(rng.uniform(0.05, 1.5), 2))
    if kind == "reset":
        return Fault(at, kind, rng.choice(topo.links), duration)
    if kind == "skew":
        who = [p for p in topo.processes if p.startswith(("host-", "coordinator-"))]
        return Fault(at, kind, rng.choice(who), duration, param=float(rng.choice((-1, 1)) * rng.randint(5, 600)),
                     direction=rng.choice(("back", "jump")))
    if kind == "disk_full" and topo.nats:
        return Fault(at, kind, f"nats-{rng.randrange(topo.nats)}", duration)
    return None


def _processes_of(f: Fault) -> set[str]:
    return set(f.target.split("->"))


def _fits(new: Fault, faults: Sequence[Fault]) -> bool:
    """``new`` may join ``faults``: no overlap on a target, the limits of :func:`draw`."""
    span = max(new.duration, 1.0)
    during = [f for f in faults if f.at < new.at + span and new.at < f.at + max(f.duration, 1.0)]
    if len(during) >= MAX_CONCURRENT:
        return False
    for f in during:
        if _processes_of(f) & _processes_of(new):
            return False
        for engine in ("etcd-", "nats-"):
            if any(p.startswith(engine) for p in _processes_of(f)) and any(
                    p.startswith(engine) for p in _processes_of(new)):
                return False
    return True


def shrink(schedule: Schedule, fails: Callable[[Schedule], bool], budget: int = 8) -> Schedule:
    """A smaller schedule that still fails (delta debugging over the faults).

    Tries dropping ever smaller slices of the faults; keeps a drop whenever ``fails`` says
    the rest still fails. Each call of ``fails`` replays a whole schedule, so at most
    ``budget`` calls are made.

    Args:
        schedule: a schedule known to fail.
        fails: replays a schedule; true when it still shows a violation.
        budget: the most replays to spend.

    Returns:
        The smallest failing schedule found (``schedule`` itself if no cut still failed).
    """
    faults = list(schedule.faults)
    n = 2
    tries = 0
    while len(faults) >= 1 and tries < budget:
        size = max(1, len(faults) // n)
        cut = False
        for start in range(0, len(faults), size):
            if tries >= budget:
                break
            rest = faults[:start] + faults[start + size:]
            tries += 1
            if fails(Schedule(schedule.seed, schedule.minutes, rest)):
                faults, n, cut = rest, max(n - 1, 2), True
                break
        if not cut:
            if size == 1:
                break
            n = min(len(faults), n * 2)
    return Schedule(schedule.seed, schedule.minutes, faults)


def dumps(schedule: Schedule) -> str:
    """The schedule as JSON (``{"seed", "minutes", "faults": [...]}``)."""
    return json.dumps({"seed": schedule.seed, "minutes": schedule.minutes,
                       "faults": [asdict(f) for f in schedule.faults]}, indent=1)


def loads(text: str) -> Schedule:
    """The schedule from :func:`dumps`'s JSON.

    Raises:
        ValueError: not a schedule (missing fields, an unknown kind).
    """
    data = json.loads(text)
    try:
        faults = [Fault(**f) for f in data["faults"]]
        out = Schedule(int(data["seed"]), float(data["minutes"]), faults)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a nemesis schedule: {exc}") from exc
    bad = [f.kind for f in faults if f.kind not in KINDS]
    if bad:
        raise ValueError(f"unknown fault kinds {bad}")
    return out
