# syntax=docker/dockerfile:1
# One image for every baton service. Pick the service with the command:
#   docker run IMAGE baton-coordinator     (gRPC :7100)
#   docker run IMAGE baton-sandbox-host    (gRPC :7200)
#   docker run IMAGE baton-gateway         (HTTP :8080)
#   docker run IMAGE baton --help          (operator CLI: runs, tail, cancel, reap, health, drain)
# The image installs both distributions (baton-runs, baton-runs-server) with the extras
# `server`, `docker` and `cli` (the CLI's health and drain commands are what the probes run)
# at the versions of requirements.lock; not `tools`: no etcd or nats-server binaries ship in
# it (compose and Kubernetes run their own).
# Configuration is BATON_* environment variables only (README.md, `python -m baton.config`).
#
# Targets: the default (last) stage is the service image; `--target sandbox` is the image the
# docker provider starts sandboxes from (compose builds both).
#
# Two ways to build, same file:
#   docker build -t baton:local .                 (with an index: python:3.11 base, pip from PyPI)
#   scripts/build_image.sh                        (offline: a debootstrap'ed Debian base,
#       BASE=baton-base:bookworm, and every wheel from wheelhouse/ with OFFLINE=1)
# Only the classic builder's features are used (docker-compose v1 builds with it).

# Any Debian-like image with python3 >= 3.11 and its venv module.
ARG BASE=python:3.11-slim-bookworm

# ---- build: a virtualenv with the dependencies, then the project ----------------------
FROM ${BASE} AS build
# OFFLINE=1: install from wheelhouse/ alone, never an index (scripts/build_image.sh fills it).
ARG OFFLINE=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python3 -m venv /opt/baton/venv
# Dependencies first, in a layer of their own: it is reused until pyproject.toml, the lock or
# the wheelhouse change, so a source change rebuilds only the small layer below.
COPY pyproject.toml requirements.lock ./
COPY scripts/image_requirements.py ./scripts/
COPY wheelhouse/ /wheelhouse/
RUN python3 scripts/image_requirements.py server,docker,kubernetes,cli > /tmp/requirements.txt \
 && /opt/baton/venv/bin/pip install -q ${OFFLINE:+--no-index} --find-links /wheelhouse \
      --constraint requirements.lock --requirement /tmp/requirements.txt
COPY README.md dist_split.py ./
COPY server-dist ./server-dist
COPY baton ./baton
COPY baton_tools ./baton_tools
COPY coordinator ./coordinator
COPY sandbox_host ./sandbox_host
COPY gateway ./gateway
# Both distributions of the repository (dist_split.py): the client `baton-runs` (.) and the
# services and tools `baton-runs-server` (./server-dist). --no-deps: every dependency is in
# already (the extras' list above is the same).
RUN /opt/baton/venv/bin/pip install -q ${OFFLINE:+--no-index} --find-links /wheelhouse --no-deps . ./server-dist \
 && /opt/baton/venv/bin/pip check

# ---- sandbox: what the docker provider starts agents in --------------------------------
# The base's python3 (the replay agent), sh and coreutils; root inside the sandbox, as the
# provider's execs need to create /workspace and /baton; /opt/baton-daemon: a Python with the
# sandbox daemon's dependencies (the provider copies the daemon's own source in and runs it as
# the container's main process). A real agent (claude, codex) needs an image with its CLI
# too: set BATON_DOCKER_IMAGE to one built FROM this target.
FROM ${BASE} AS sandbox
COPY --from=build /opt/baton/venv /opt/baton-daemon
CMD ["sleep", "infinity"]

# ---- runtime --------------------------------------------------------------------------
FROM ${BASE}
ENV PATH=/opt/baton/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    BATON_REPLAY_DIRS=/opt/baton/corpus \
    BATON_JOURNAL_DIR=/var/lib/baton/runs \
    BATON_SANDBOX_DIR=/var/lib/baton/sandboxes \
    BATON_LOG_FORMAT=json
RUN groupadd --system --gid 10001 baton \
 && useradd --system --uid 10001 --gid baton --home-dir /var/lib/baton --create-home baton \
 && mkdir -p /var/lib/baton/runs /var/lib/baton/sandboxes \
 && chown -R baton:baton /var/lib/baton
COPY --from=build /opt/baton/venv /opt/baton/venv
# The replay agent's recorded journals (read only from BATON_REPLAY_DIRS).
COPY corpus /opt/baton/corpus
USER baton
WORKDIR /var/lib/baton
EXPOSE 7100 7200 8080
# Default: the operator CLI's help. Compose and Kubernetes name the service to run.
CMD ["baton", "--help"]
