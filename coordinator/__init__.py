"""The coordinator service: the control plane over etcd (docs/design.md §3).

Public surface: :class:`CoordinatorServer` (composition root), :class:`CoordinatorConfig`,
:class:`RunStore` (the etcd-backed store), :class:`LeaderContext` and :data:`LeaderTask`
(the hook for leader-only background tasks), and :func:`build_store`.
"""
from coordinator._config import CoordinatorConfig, parse_args
from coordinator._election import LeaderContext, LeaderElection, LeaderTask
from coordinator._server import CoordinatorServer, build_store
from coordinator._service import Reaper, no_reaper
from coordinator._store import RunStore, UpdateOutcome

__all__ = [
    "CoordinatorConfig", "CoordinatorServer", "LeaderContext", "LeaderElection", "LeaderTask",
    "Reaper", "RunStore", "UpdateOutcome", "build_store", "no_reaper", "parse_args",
]
