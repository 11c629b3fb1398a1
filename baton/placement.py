"""Which sandbox host takes a run: the one rule, pure (used by failover, gateway and drain).

A host is a :class:`Candidate` (its load now, its capacity, whether it drains). Placing
runs is greedy and accounts for each assignment as it is made, so a batch of runs spreads
over the hosts with room instead of landing on the one that was least loaded before the
batch (otherwise a batch of orphans all goes to one host). The order of hosts:

1. hosts with room before full ones (``capacity`` 0 = no limit; a full host is never
   assigned by :func:`assign`, and only tried last by :func:`order`, because a published
   load may be a second stale);
2. least loaded per unit of capacity (``load / max(capacity, 1)``), so a host of
   capacity 8 with 4 runs ranks with a host of capacity 2 with 1 run;
3. then fewer runs this placer handed to it so far (``handed``), per unit of capacity;
4. then the host id: deterministic, so tests and logs can predict the choice.

Draining hosts are never candidates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Candidate:
    """One host as placement sees it.

    Attributes:
        host_id: the host's id.
        load: runs it drives now (claims it holds, or its published load).
        capacity: most runs it takes; ``0`` = no limit.
        draining: a draining host takes no run.
    """

    host_id: str
    load: int = 0
    capacity: int = 0
    draining: bool = False

    def has_room(self, extra: int = 0) -> bool:
        """Whether it can take one more run on top of ``load + extra``."""
        return self.capacity <= 0 or self.load + extra < self.capacity


def _key(c: Candidate, pending: int, handed: int) -> tuple[bool, float, float, str]:
    cap = max(c.capacity, 1)
    return (not c.has_room(pending), (c.load + pending) / cap, handed / cap, c.host_id)


def order(hosts: Iterable[Candidate], *, pending: Mapping[str, int] | None = None,
          handed: Mapping[str, int] | None = None) -> list[Candidate]:
    """Every non-draining host in the order to try them (rules 1-4 of the module).

    Args:
        hosts: the candidates.
        pending: runs assigned to a host but not yet counted in its ``load`` (assignments
            in flight); they count as load.
        handed: runs this placer handed to a host so far; only a tie-break (rule 3), for a
            ``load`` that is refreshed slowly (a published load).

    Returns:
        The non-draining hosts, best first; full hosts last.
    """
    pending, handed = pending or {}, handed or {}
    return sorted((h for h in hosts if not h.draining),
                  key=lambda h: _key(h, pending.get(h.host_id, 0), handed.get(h.host_id, 0)))


def assign(hosts: Sequence[Candidate], n: int, *, pending: Mapping[str, int] | None = None) -> list[str]:
    """Place ``n`` runs, one at a time, each on the best host counting those placed before.

    Args:
        hosts: the candidates.
        n: runs to place (``<= 0`` places none).
        pending: runs assigned earlier but not yet in ``load`` (see :func:`order`).

    Returns:
        One host id per placed run, in placement order; shorter than ``n`` when capacity
        runs out (a host never gets more than ``capacity`` counting ``load`` and ``pending``).
    """
    placed: dict[str, int] = dict(pending or {})
    live = [h for h in hosts if not h.draining]
    out: list[str] = []
    for _ in range(max(n, 0)):
        room = [h for h in live if h.has_room(placed.get(h.host_id, 0))]
        if not room:
            break
        best = min(room, key=lambda h: _key(h, placed.get(h.host_id, 0), 0))
        placed[best.host_id] = placed.get(best.host_id, 0) + 1
        out.append(best.host_id)
    return out
