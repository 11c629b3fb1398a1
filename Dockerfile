# syntax=docker/dockerfile:1
# One image for every baton service. Pick the service with the command:
#   docker run IMAGE baton-coordinator     (gRPC :7100)
#   docker run IMAGE baton-sandbox-host    (gRPC :7200)
#   docker run IMAGE baton-gateway         (HTTP :8080)
#   docker run IMAGE baton --help          (operator CLI: runs, tail, cancel, reap, health, drain)
# The image installs the extras `server`, `docker` and `cli` (the CLI's health and drain
# commands are what the probes run) at the versions of requirements.lock; not `tools`: no
# etcd or nats-server binaries ship in it (compose and Kubernetes run their own).
# Configuration is BATON_* environment variables only (README.md, `python -m baton.config`).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: wheels for the project and every dependency --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY baton ./baton
COPY baton_tools ./baton_tools
COPY coordinator ./coordinator
COPY sandbox_host ./sandbox_host
COPY gateway ./gateway
RUN pip wheel --constraint requirements.lock --wheel-dir /wheels '.[server,docker,cli]'

# ---- runtime ------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    BATON_REPLAY_DIRS=/opt/baton/corpus \
    BATON_JOURNAL_DIR=/var/lib/baton/runs \
    BATON_SANDBOX_DIR=/var/lib/baton/sandboxes
# Plain COPY (not a BuildKit bind mount) so the classic builder of docker-compose works too.
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --find-links=/tmp/wheels 'baton[server,docker,cli]' \
 && rm -rf /tmp/wheels \
 && groupadd --system --gid 10001 baton \
 && useradd --system --uid 10001 --gid baton --home-dir /var/lib/baton --create-home baton \
 && mkdir -p /var/lib/baton/runs /var/lib/baton/sandboxes \
 && chown -R baton:baton /var/lib/baton
# The replay agent's recorded journals (read only from BATON_REPLAY_DIRS).
COPY corpus /opt/baton/corpus
USER baton
WORKDIR /var/lib/baton
EXPOSE 7100 7200 8080
# Default: the operator CLI's help. Compose and Kubernetes name the service to run.
CMD ["baton", "--help"]
