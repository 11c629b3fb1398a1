#!/usr/bin/env bash
# Make a Docker engine, the offline sandbox image and the offline base of the baton image available.
#
# Idempotent: installs Debian's docker.io and debootstrap only when missing, starts dockerd
# only when `docker info` fails (and waits for it), builds `baton-sandbox:latest` only when
# the engine does not have it (or has an older build of it). No image registry is needed:
# the base is a debootstrap'ed Debian bookworm (minbase + python3 with its standard library,
# which the replay agent needs; python3-minimal lacks json; + python3-venv, which the baton
# image's Dockerfile uses) imported with `docker import` as $BATON_BASE_IMAGE (the base the
# baton service image builds FROM offline, scripts/build_image.sh); the rootfs tarball is
# cached under $BATON_DOCKER_CACHE so a rebuild does not hit the mirror again. The sandbox
# image adds one layer to it: /opt/baton-daemon, a virtualenv with the sandbox daemon's
# dependencies (wheels downloaded with this machine's pip configuration, cached too).
#
# Exit status 0 means: `docker info` answers and both tags exist. Anything else prints the
# failing step on stderr and exits non-zero (CI then runs without BATON_TEST_DOCKER=1).
#
# Environment:
#   BATON_DOCKER_IMAGE   image tag to build (default baton-sandbox:latest)
#   BATON_BASE_IMAGE     second tag of the same image, the service image's base (default baton-base:bookworm)
#   BATON_DOCKER_CACHE   cache directory for the rootfs tarball (default /var/cache/baton)
#   BATON_DOCKERD_LOG    dockerd log file (default /tmp/dockerd.log)
#   BATON_DEBIAN_MIRROR  mirror for debootstrap (default: the one apt is configured with)
set -euo pipefail

IMAGE="${BATON_DOCKER_IMAGE:-baton-sandbox:latest}"
BASE_IMAGE="${BATON_BASE_IMAGE:-baton-base:bookworm}"
CACHE="${BATON_DOCKER_CACHE:-/var/cache/baton}"
DOCKERD_LOG="${BATON_DOCKERD_LOG:-/tmp/dockerd.log}"
SUITE=bookworm
PACKAGES=python3,python3-venv
# Bump when an image's content changes: an engine holding an older build gets a new one.
BASE_VERSION=3
IMAGE_VERSION=4
TARBALL="$CACHE/sandbox-rootfs-$SUITE-v$BASE_VERSION.tar"
# What the sandbox daemon (sandbox_host/daemon) imports beyond the standard library.
DAEMON_PACKAGES="grpcio grpcio-health-checking grpcio-status protobuf googleapis-common-protos"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

say() { echo "docker_setup: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"; else
        die "need root for: $*"; fi
}

# --- 1. packages ---------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    # Other jobs on the machine may hold the dpkg lock; wait for it instead of failing.
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        "${need[@]}" >/dev/null || die "apt-get install ${need[*]}"
fi
command -v docker >/dev/null 2>&1 || die "no docker CLI after install"

# --- 2. engine -----------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $DOCKERD_LOG)"
    # --iptables=false: sandboxes need no published ports, and nested/unprivileged
    # environments often lack the iptables modules dockerd would otherwise insist on.
    as_root sh -c "nohup dockerd --iptables=false </dev/null >>'$DOCKERD_LOG' 2>&1 &"
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -n 30 "$DOCKERD_LOG" >&2 || true; die "dockerd did not answer within 60 s"; }
fi

# --- 3. images -----------------------------------------------------------------------------
# The base ($BASE_IMAGE): the debootstrap'ed rootfs imported as it is. The sandbox image
# ($IMAGE): the base plus /opt/baton-daemon, a virtualenv holding the sandbox daemon's
# dependencies (grpcio, protobuf, health, status), installed from wheels downloaded on this
# machine; the daemon's own source is copied into each container by the docker provider.
version_of() { docker image inspect --format '{{ index .Config.Labels "baton.image-version" }}' "$1" 2>/dev/null || true; }
if [ "$(version_of "$IMAGE")" = "$IMAGE_VERSION" ] && [ "$(version_of "$BASE_IMAGE")" = "$BASE_VERSION" ]; then
    say "engine up, images $IMAGE and $BASE_IMAGE present"
    exit 0
fi

if [ "$(version_of "$BASE_IMAGE")" != "$BASE_VERSION" ]; then
    mirror="${BATON_DEBIAN_MIRROR:-}"
    if [ -z "$mirror" ]; then
        # The mirror apt already uses is reachable here; a registry is not.
        mirror=$(grep -rhoE '^URIs:\s*\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null \
                     | awk '{print $2}' | grep -v security | head -n1 || true)
        [ -n "$mirror" ] || mirror=$(grep -hoE '^deb\s+\S+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1 || true)
        [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    fi
    as_root mkdir -p "$CACHE"
    if [ ! -s "$TARBALL" ]; then
        rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        say "debootstrap $SUITE from $mirror into $rootfs (about a minute)"
        as_root debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" \
            >"$CACHE/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE/debootstrap.log" >&2; die "debootstrap"; }
        # Downloaded .debs and apt lists are not needed at run time (halves the image).
        as_root sh -c "rm -f '$rootfs'/var/cache/apt/archives/*.deb; rm -rf '$rootfs'/var/lib/apt/lists/*"
        # Write to a temp name and rename, so an interrupted run never leaves a partial cache.
        as_root tar -C "$rootfs" -cf "$TARBALL.part" . || die "tar rootfs"
        as_root mv "$TARBALL.part" "$TARBALL"
        as_root rm -rf "$rootfs"
    fi
    say "importing $TARBALL as $BASE_IMAGE"
    docker import --change 'CMD ["sleep", "infinity"]' --change "LABEL baton.image-version=$BASE_VERSION" --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$TARBALL" "$BASE_IMAGE" >/dev/null || die "docker import"
    docker run --rm "$BASE_IMAGE" python3 -c 'import json, argparse, datetime, ensurepip' >/dev/null || die "image smoke test (python3 stdlib)"
fi

# The daemon's wheels, at the versions of requirements.lock, cached by the lock's hash.
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
key=$(cat "$ROOT/requirements.lock" | sha256sum | cut -c1-16)
wheels="$CACHE/daemon-wheels-$key"
if [ ! -f "$wheels/.complete" ]; then
    say "downloading the sandbox daemon's wheels into $wheels"
    as_root mkdir -p "$wheels"
    "$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: --constraint "$ROOT/requirements.lock" \
        --dest "$wheels" $DAEMON_PACKAGES || die "pip download (sandbox daemon wheels)"
    touch "$wheels/.complete"
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp -p "$wheels"/*.whl "$ctx"/
cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
COPY *.whl /tmp/wheels/
RUN python3 -m venv /opt/baton-daemon \\
 && /opt/baton-daemon/bin/pip install -q --disable-pip-version-check --no-index --find-links /tmp/wheels $DAEMON_PACKAGES \\
 && rm -rf /tmp/wheels
LABEL baton.image-version=$IMAGE_VERSION
CMD ["sleep", "infinity"]
DOCKERFILE
say "building $IMAGE ($BASE_IMAGE + the sandbox daemon's dependencies)"
DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" "$ctx" >/dev/null || die "docker build $IMAGE"
docker run --rm "$IMAGE" /opt/baton-daemon/bin/python -c 'import grpc, grpc_health.v1.health, grpc_status, google.protobuf' \
    || die "image smoke test (the daemon's dependencies)"
say "engine up, images $IMAGE and $BASE_IMAGE built"
