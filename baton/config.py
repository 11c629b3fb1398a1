"""Configuration from ``BATON_*`` environment variables (docs/design.md §9).

Every setting has a default; each service reads the ones it needs. The table in
docs/operating.md is generated from :data:`SETTINGS` (``python -m baton.config``), so it cannot drift.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Setting:
    env: str
    default: str
    meaning: str


SETTINGS: tuple[Setting, ...] = (
    Setting("BATON_ETCD_ENDPOINTS", "127.0.0.1:2379", "etcd endpoints (host:port, comma-separated); coordinator only"),
    Setting("BATON_ETCD_PREFIX", "/baton/", "key prefix for everything baton stores in etcd"),
    Setting("BATON_NATS_URL", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated"),
    Setting("BATON_COORDINATOR", "127.0.0.1:7100", "coordinator gRPC address(es) that hosts and gateways dial, comma-separated"),
    Setting("BATON_COORDINATOR_LISTEN", "0.0.0.0:7100", "coordinator gRPC listen address"),
    Setting("BATON_HOST_LISTEN", "0.0.0.0:7200", "sandbox host gRPC listen address"),
    Setting("BATON_HOST_ADVERTISE", "", "address other components use to reach this host (default: listen address with the machine's hostname)"),
    Setting("BATON_HOST_ID", "", "sandbox host id (default: hostname-pid)"),
    Setting("BATON_HOST_CAPACITY", "64", "runs one sandbox host drives at most"),
    Setting("BATON_GATEWAY_LISTEN", "0.0.0.0:8080", "gateway HTTP listen address"),
    Setting("BATON_GATEWAY_WORKERS", "1", "gateway: worker processes serving the HTTP, gRPC and /ds ports together (SO_REUSEPORT; a supervisor restarts a dead one). Each worker is a gateway of its own (session, one log consumer per run it serves); BATON_START_* and BATON_HTTP_CONNECTIONS_PER_CLIENT are divided among them, and each has its own metrics port (docs/operating.md \"Gateway workers\")"),
    Setting("BATON_GATEWAY_ADVERTISE", "", "address the coordinator probes to tell a dead gateway from a cut-off one (default: the HTTP listen address with the machine's hostname)"),
    Setting("BATON_START_PER_TENANT", "64", "gateway: run starts of one tenant in flight at once (0 = no limit); more wait their turn"),
    Setting("BATON_START_PER_HOST", "32", "gateway: run starts in flight at once per live sandbox host (0 = no limit); more wait their turn"),
    Setting("BATON_START_QUEUE", "512", "gateway: run starts waiting for a slot, at most; past it 429 TOO_MANY_STARTS with Retry-After (0 = no limit)"),
    Setting("BATON_START_WAIT", "30", "gateway: seconds a run start waits for a slot before 429 TOO_MANY_STARTS (0 = no limit)"),
    Setting("BATON_HTTP_HEADER_TIMEOUT", "10", "gateway: seconds a connection may take to send a complete request head (from its opening or its previous response's end); past it the connection is closed (0 = no limit)"),
    Setting("BATON_HTTP_BODY_TIMEOUT", "30", "gateway: seconds a request body may go without a byte; past it 408 REQUEST_TIMEOUT and the connection is closed (0 = no limit; responses, SSE included, are never timed)"),
    Setting("BATON_HTTP_CONNECTIONS_PER_CLIENT", "256", "gateway: HTTP connections open at once from one client IP address; past it 429 TOO_MANY_CONNECTIONS and closed (0 = no limit). Clients behind one proxy or NAT share its address: size it for the proxy"),
    Setting("BATON_GATEWAY_GRPC_LISTEN", "0.0.0.0:8081", "gateway gRPC listen address of the public baton.v1.Runs API (empty = off)"),
    Setting("BATON_INTERNAL_TOKEN", "", "shared secret every internal gRPC call (coordinator, sandbox hosts) must carry; empty = no internal auth (then a coordinator or host listening off loopback refuses to start, see BATON_ALLOW_INSECURE). A placeholder (`change-me`...) is refused at start-up"),
    Setting("BATON_ALLOW_INSECURE", "", "1 = a service may listen on a non-loopback address without its auth (coordinator and hosts: BATON_INTERNAL_TOKEN; gateway: BATON_API_KEYS); empty = such a start is refused (docs/deploy.md, \"Credentials\")"),
    Setting("BATON_TLS_CERT", "", "PEM file: this service's certificate (chain). Coordinators and hosts serve their gRPC with it; every internal call presents it as the client certificate. Internal TLS is on when this or BATON_TLS_CA is set (docs/deploy.md, \"TLS\")"),
    Setting("BATON_TLS_KEY", "", "PEM file: the private key of BATON_TLS_CERT"),
    Setting("BATON_TLS_CA", "", "PEM file: the CA bundle internal clients check servers against, and (with BATON_TLS_CLIENT_AUTH) servers check clients against; empty = the system's roots"),
    Setting("BATON_TLS_CLIENT_AUTH", "", "1 = coordinators and hosts refuse a caller without a certificate signed by BATON_TLS_CA (mutual TLS; counts as internal auth, like BATON_INTERNAL_TOKEN: either or both)"),
    Setting("BATON_TLS_SERVER_NAME", "", "the name internal clients expect in every coordinator's and host's certificate (empty = the host of the address dialled); for addresses no certificate names, such as pod IPs"),
    Setting("BATON_SANDBOX_CA_CERT", "", "hosts: PEM file of the sandbox CA; set (with BATON_SANDBOX_CA_KEY), each docker, kubernetes and local sandbox's daemon serves TLS with a certificate the creating host mints for it, and every host checks daemons against this CA (docs/deploy.md, \"Sandbox daemons over TLS\"); empty = the daemon link is plaintext with the sandbox's token"),
    Setting("BATON_SANDBOX_CA_KEY", "", "hosts: PEM file, the private key of BATON_SANDBOX_CA_CERT (signs sandbox daemons' certificates; never leaves the hosts)"),
    Setting("BATON_SANDBOX_CERT_TTL", "604800", "hosts: seconds a sandbox daemon's certificate is valid once minted (at the sandbox's creation; a local sandbox's at each start of its daemon): the host driving the run renews it in place once less than a third is left (docs/deploy.md, Sandbox daemons over TLS); a sandbox nobody drives for longer than a third of it may expire and become unreachable"),
    Setting("BATON_GATEWAY_TLS_CERT", "", "gateway: PEM file of the public certificate; set (with BATON_GATEWAY_TLS_KEY), the HTTP port serves HTTPS and the gRPC port TLS (no client certificates); empty = plaintext (TLS at the ingress)"),
    Setting("BATON_GATEWAY_TLS_KEY", "", "gateway: PEM file, the private key of BATON_GATEWAY_TLS_CERT"),
    Setting("BATON_ETCD_CA", "", "coordinator: PEM file of the CA etcd's certificates are checked against; set (or an https:// endpoint), etcd is dialled with TLS"),
    Setting("BATON_ETCD_CERT", "", "coordinator: PEM file of the client certificate for etcd's --client-cert-auth (with BATON_ETCD_KEY)"),
    Setting("BATON_ETCD_KEY", "", "coordinator: PEM file, the private key of BATON_ETCD_CERT"),
    Setting("BATON_ETCD_USER", "", "coordinator: etcd user; with BATON_ETCD_PASSWORD the coordinator authenticates and sends etcd's token on every call (a new one when etcd refuses it)"),
    Setting("BATON_ETCD_PASSWORD", "", "coordinator: the password of BATON_ETCD_USER (never logged; a placeholder is refused at start-up)"),
    Setting("BATON_NATS_CA", "", "PEM file of the CA NATS servers' certificates are checked against (when a server requires TLS)"),
    Setting("BATON_NATS_CERT", "", "PEM file of the client certificate for a NATS server whose tls block has verify: true (with BATON_NATS_KEY)"),
    Setting("BATON_NATS_KEY", "", "PEM file, the private key of BATON_NATS_CERT"),
    Setting("BATON_NATS_CREDS", "", "NATS .creds file (user JWT and nkey seed: decentralized auth); user and password or a token go in BATON_NATS_URL"),
    Setting("BATON_NATS_NKEY_SEED", "", "file holding a NATS user's nkey seed (SU...: nkey auth); not with BATON_NATS_CREDS"),
    Setting("BATON_DATA_DIR", ".data/cluster", "the baton CLI's cluster data directory (its -d): where `baton up` keeps the cluster's data, cluster.json and internal token, and where the other commands find them"),
    Setting("BATON_SESSION_TTL", "2", "session lease TTL in seconds (keep-alive every TTL/3)"),
    Setting("BATON_FAST_FAILOVER", "1", "coordinator: revoke a session at once when its keep-alive stream resets and its process's address refuses connections (0 = wait for the lease TTL)"),
    Setting("BATON_ATTACH_WAIT", "10", "seconds an attach waits for the journal to appear / first byte"),
    Setting("BATON_APPROVAL_TIMEOUT", "600", "seconds a tool approval waits for its answer before it counts as denied (a run's agent option approvalTimeout overrides it)"),
    Setting("BATON_JOURNAL_POLL", "0.25", "journal poll interval in seconds (providers that cannot follow)"),
    Setting("BATON_JOURNAL_DIR", "/tmp/baton-runs", "where local sandboxes keep journals"),
    Setting("BATON_SANDBOX_DIR", "/tmp/baton-sandboxes", "where local sandboxes are created"),
    Setting("BATON_LOCAL_SANDBOX_IO", "direct", "local sandboxes: direct = a host makes a sandbox's calls itself on the machine (the agent's launch, its files, inputs, signals, trees, journal reads) with the daemon's own operations over the same paths, and starts a daemon only for setup commands (whose parent must not be the host); daemon = every call through the sandbox's own daemon process, as for docker and kubernetes sandboxes (its link then gets the sandbox CA's certificates, when one is set)"),
    Setting("BATON_PROVIDER", "local", "default sandbox provider: local | docker | kubernetes"),
    Setting("BATON_DOCKER_IMAGE", "baton-sandbox:latest", "image for docker sandboxes"),
    Setting("BATON_DOCKER_NETWORK", "", "network of docker sandboxes, which the hosts must reach (their daemons, port "
            "7300); empty: the engine's default bridge"),
    Setting("BATON_K8S_KUBECONFIG", "", "kubernetes provider: kubeconfig file of the API the hosts create sandbox pods through (empty = the pod's ServiceAccount in a cluster, else KUBECONFIG or ~/.kube/config)"),
    Setting("BATON_K8S_NAMESPACE", "", "kubernetes provider: namespace of the sandbox pods (empty = the kubeconfig's, in a cluster the host's own)"),
    Setting("BATON_K8S_IMAGE", "baton:latest", "kubernetes provider: the sandbox pods' image; it runs the sandbox daemon (`python -m sandbox_host.daemon`: baton installed) and the agents' CLIs"),
    Setting("BATON_K8S_DAEMON_PORT", "7300", "kubernetes provider: the sandbox daemon's gRPC port on each sandbox pod's IP"),
    Setting("BATON_K8S_CPU", "", "kubernetes provider: CPU request and limit of a sandbox pod (e.g. `1`, `500m`; empty = none)"),
    Setting("BATON_K8S_MEMORY", "", "kubernetes provider: memory request and limit of a sandbox pod (e.g. `2Gi`; empty = none)"),
    Setting("BATON_K8S_DISK", "", "kubernetes provider: size limit of a sandbox pod's emptyDir (workspace, journal; e.g. `10Gi`; empty = none)"),
    Setting("BATON_K8S_SERVICE_ACCOUNT", "baton-sandbox", "kubernetes provider: ServiceAccount of the sandbox pods (no API token is mounted; empty = the namespace's default)"),
    Setting("BATON_K8S_GRACE", "5", "kubernetes provider: a sandbox pod's termination grace period (s)"),
    Setting("BATON_K8S_READY_TIMEOUT", "120", "kubernetes provider: seconds a sandbox may take from its create to its daemon answering (scheduling, image pull); past it the run fails with SandboxBuildFailed and the pod is deleted"),
    Setting("BATON_K8S_AGENT_SANDBOX", "auto", "kubernetes provider: `auto` = a kubernetes-sigs/agent-sandbox `Sandbox` per sandbox where its CRD is served (else a bare pod), `on`, `off`"),
    Setting("BATON_CANCEL_GRACE", "5", "seconds between SIGTERM and SIGKILL on cancel"),
    Setting("BATON_DETACHED_RUN_TTL", "3600", "seconds a run may stay detached before the reaper cancels it"),
    Setting("BATON_DETACHED_RUN_TTL_MAX", "86400", "gateways: the longest detached TTL (seconds) a client may ask for a run (a join's `keepTtl`, `POST /api/runs/{runId}/keep`, gRPC `KeepRun`); a longer request is clamped to it and the answer says what was granted"),
    Setting("BATON_REAPER_INTERVAL", "60", "seconds between reaper sweeps (leader only)"),
    Setting("BATON_RECORD_CACHE_SIZE", "10000", "runs whose record the coordinator remembers, so a claim or update is one etcd transaction (0 disables; writes still compare in etcd)"),
    Setting("BATON_RECORD_RETENTION", "", "seconds a terminal run record (with its thread-membership and sandbox entries) is kept after the run ended; empty = BATON_LOG_MAX_AGE, 0 = forever (leader only)"),
    Setting("BATON_ETCD_PAGE_SIZE", "500", "keys per etcd range response: the coordinator pages every range read"),
    Setting("BATON_RUNS_STREAM", "BATON_RUNS", "JetStream stream holding delivery logs"),
    Setting("BATON_SUBJECT_PREFIX", "baton.runs", "subject prefix of delivery logs"),
    Setting("BATON_THREADS_BUCKET", "baton-threads", "JetStream KV bucket holding transcripts"),
    Setting("BATON_LOG_MAX_AGE", "2592000", "delivery-log retention in seconds (30 days); coordinators: how long a run id whose record retention deleted stays retired"),
    Setting("BATON_SNAPSHOT_CHUNKS", "5000", "hosts: a run's log gets a snapshot (the messages so far, for a join from a snapshot) once this many chunks were appended since the last one (and at least as many bytes as the last snapshot weighs), at the next point where no message is open (0 = never by count)"),
    Setting("BATON_SNAPSHOT_BYTES", "1048576", "hosts: as BATON_SNAPSHOT_CHUNKS, once this many bytes of chunk JSON were appended (1 MiB; 0 = never by size); whichever comes first"),
    Setting("BATON_LOG_COMPACT_AFTER", "0", "coordinators (leader only, at the reaper's pace): seconds after a run ended before its delivery log is compacted to its final snapshot and its end (a later join from the start gets `CUSTOM stream.compacted`, then the snapshot); a log whose final snapshot does not cover its last chunk is left whole; 0 = never. The leader connects to NATS (BATON_NATS_*) for it"),
    Setting("BATON_LOG_REPLICAS", "1", "JetStream replicas for the stream and bucket"),
    Setting("BATON_LOG_MAX_CONSUMERS", "100000", "the most consumers the runs stream takes at once (its max_consumers; every read of a run's log is one: each gateway's shared tail of a run, lingering tails, readers behind a tail). nats-server 2.15 gives a stream that names none 1,000, and a read past the limit waits until another ends"),
    Setting("BATON_WORKSPACE_OBJECTS", "baton-workspaces", "JetStream Object Store bucket holding workspace snapshots (manifests and packs)"),
    Setting("BATON_WORKSPACE_HEADS", "baton-sessions", "JetStream KV bucket holding each thread's head: its workspace snapshot and agent session"),
    Setting("BATON_WORKSPACE_REPLICAS", "", "JetStream replicas of the two workspace buckets (empty = BATON_LOG_REPLICAS)"),
    Setting("BATON_WORKSPACE_MAX_BYTES", "1073741824", "bytes of file content a workspace may hold (1 GiB): checked after its clone or copy and at every snapshot; a larger tree is refused (WORKSPACE_TOO_LARGE)"),
    Setting("BATON_WORKSPACE_EXCLUDES", "home/.claude/.credentials.json,home/.codex/auth.json", "comma-separated glob patterns of workspace paths never snapshotted (a pattern with a / matches the path from the root, one without matches any path component)"),
    Setting("BATON_WORKSPACE_IDLE_TTL", "2592000", "seconds a thread's head is kept after its last save (30 days; 0 = forever); snapshots no head reaches are collected by the workspace gc"),
    Setting("BATON_WORKSPACE_WARM_TTL", "3600", "hosts: seconds a thread's directory is kept on the machine after its last turn, for a warm follow-up (0 = never kept warm)"),
    Setting("BATON_WORKSPACE_GC_INTERVAL", "600", "hosts: seconds between workspace upkeep sweeps (snapshots no thread head reaches; idle thread directories); 0 = none"),
    Setting("BATON_WORKSPACE_GC_GRACE", "3600", "hosts: seconds an unreachable snapshot or pack is kept before the gc deletes it (longer than any snapshot takes to write)"),
    Setting("BATON_SSE_KEEPALIVE", "15", "seconds between SSE/NDJSON keep-alive comments"),
    Setting("BATON_TAIL_LINGER", "10", "gateways: seconds a run's shared tail (its log read, its kept frames) stays after its last reader left, so a reader back within it (a reload, an SSE reconnect) resumes from memory; 0 = it goes with its last reader"),
    Setting("BATON_HTTP_COMPRESSION", "gzip", "gateways: `gzip` = an SSE/NDJSON stream is sent gzip-encoded to a client whose Accept-Encoding admits it (browsers, fetch, httpx, Go all do; every write flushed, so each chunk decodes on arrival); `off` = never"),
    Setting("BATON_REPLAY_DIRS", "", "colon-separated directories replay journals may be read from (default: the shipped corpus)"),
    Setting("BATON_WORKSPACE_DIRS", "", "directories (colon- or comma-separated) a request's workspace `dir`, or a local git path, may name; empty = none (gateway and hosts)"),
    Setting("BATON_GIT_CREDENTIALS_FILE", "", "hosts: JSON file {tenant: {name: {\"username\", \"token\", \"url\"}}} of the git credentials a workspace may name (url: the repository URL prefix each is for); empty = none"),
    Setting("BATON_WORKSPACE_BUILD_TIMEOUT", "600", "seconds a sandbox's workspace build (clone, checkout, setup commands) may take"),
    Setting("BATON_DEFAULT_AGENT", "replay", "agent kind used when a request names none"),
    Setting("BATON_API_KEYS", "", "gateway: bearer API keys, comma-separated key=tenant pairs; empty = no auth (then a gateway listening off loopback refuses to start, see BATON_ALLOW_INSECURE). A placeholder key (`change-me`...) is refused at start-up"),
    Setting("BATON_TENANT_SECRETS_DIR", "", "hosts: directory of per-tenant agent credentials, one file per credential: <dir>/<tenant>/ANTHROPIC_API_KEY (any of ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN, OPENAI_API_KEY, CODEX_API_KEY); a tenant's runs use its own over the host's environment; read at start-up; empty = none"),
    Setting("BATON_LOG_LEVEL", "INFO", "log level"),
    Setting("BATON_LOG_FORMAT", "text", "services' log lines: json (one object per line with ts, level, logger, msg, service and, when known, run_id, thread_id, epoch, host, trace_id; the image sets it) or text"),
    Setting("BATON_EVENT_LOOP", "uvloop", "event loop of the coordinator, gateway and sandbox host processes: uvloop (coordinator: about 10% more calls per CPU second; gateway: about 10% less CPU per Durable Streams append; sandbox host: 2–8% less CPU per streamed chunk) or asyncio"),
    Setting("BATON_GC_THRESHOLD", "10000,10,10", "coordinator, gateway and sandbox host processes: the cyclic garbage collector's thresholds (gen0,gen1,gen2; Python's are 700,10,10), and what is alive once the service is ready is frozen out of its collections; `default` keeps Python's collector as it is. A gateway serving 1,000 readers paused 100-230 ms in each full collection with Python's (docs/operating.md \"The garbage collector\")"),
    Setting("BATON_COORDINATOR_ID", "", "coordinator replica id in the leader election (default: hostname-pid)"),
    Setting("BATON_ETCD_TIMEOUT", "5", "seconds one coordinator RPC may spend on etcd when the caller sets no deadline"),
    Setting("BATON_ELECTION_TTL", "2", "seconds of a coordinator replica's leader-election lease"),
    Setting("BATON_COORDINATOR_METRICS_LISTEN", "0.0.0.0:9101", "coordinator: Prometheus metrics listener (host:port; port 0 = any free port, logged; empty = off; `baton up` gives each component a free port, listed in cluster.json's `ports`). No key asked: keep it on the cluster network"),
    Setting("BATON_HOST_METRICS_LISTEN", "0.0.0.0:9102", "sandbox host: Prometheus metrics listener (host:port; port 0 = any free port, logged; empty = off; `baton up` gives each component a free port, listed in cluster.json's `ports`). No key asked: keep it on the cluster network"),
    Setting("BATON_GATEWAY_METRICS_LISTEN", "0.0.0.0:9103", "gateway: Prometheus metrics listener (host:port; port 0 = any free port, logged; empty = off; `baton up` gives each component a free port, listed in cluster.json's `ports`). No key asked: keep it off the public network. The public port's /metrics then answers only without BATON_API_KEYS or with the internal token"),
)

_DEFAULTS = {s.env: s.default for s in SETTINGS}


def get(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of a ``BATON_*`` setting: the environment, else the documented default.

    Raises:
        KeyError: for a name not in :data:`SETTINGS` (a programming error).
    """
    env = os.environ if env is None else env
    if name not in _DEFAULTS:
        raise KeyError(name)
    return env.get(name, _DEFAULTS[name])


def get_float(name: str, env: Mapping[str, str] | None = None) -> float:
    """A numeric setting; raises ``ValueError`` naming the variable when it is not a number."""
    raw = get(name, env)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


EVENT_LOOPS = ("uvloop", "asyncio")


def event_loop(env: Mapping[str, str] | None = None) -> str:
    """``BATON_EVENT_LOOP``: ``"uvloop"`` or ``"asyncio"``.

    Raises:
        ValueError: naming the variable, for any other value.
    """
    loop = get("BATON_EVENT_LOOP", env)
    if loop not in EVENT_LOOPS:
        raise ValueError(f"BATON_EVENT_LOOP must be uvloop or asyncio, got {loop!r}")
    return loop


def markdown_table() -> str:
    """The configuration table of docs/operating.md."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.env}` | `{s.default}` | {s.meaning} |" for s in SETTINGS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
