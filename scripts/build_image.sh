#!/usr/bin/env bash
# Build the baton service image and the compose sandbox image offline: no image registry and
# no index reached from inside a build.
#
#   1. scripts/docker_setup.sh: a Docker engine and the base image, a debootstrap'ed Debian
#      bookworm with python3 and python3-venv imported as $BATON_BASE_IMAGE.
#   2. The wheelhouse: every wheel of baton-runs[server,docker,kubernetes,cli] at the versions of
#      requirements.lock, plus the build backend (setuptools), built on this machine with its
#      own pip configuration. Cached under $BATON_DOCKER_CACHE by a hash of pyproject.toml and
#      requirements.lock, then copied (same bytes, same mtimes) into wheelhouse/, so an
#      unchanged lock keeps the image's dependency layer cached.
#   3. `docker build` of the Dockerfile with BASE=$BATON_BASE_IMAGE and OFFLINE=1: the service
#      image ($BATON_IMAGE) and its `sandbox` target ($BATON_SANDBOX_IMAGE), the two images
#      compose.yaml uses.
#
# Idempotent and incremental: a second run with no change takes seconds (every layer cached).
#
# Environment:
#   BATON_IMAGE          service image tag (default baton:local, compose.yaml's)
#   BATON_SANDBOX_IMAGE  sandbox image tag (default baton-sandbox:local, compose.yaml's)
#   BATON_BASE_IMAGE     base image tag (default baton-base:bookworm; docker_setup.sh makes it)
#   BATON_DOCKER_CACHE   cache directory (default /var/cache/baton)
#   BATON_BUILD_LOG      steps (default: one line per Dockerfile step) | full (every line of the builds)
#   PYTHON               interpreter whose pip builds the wheelhouse (default: .venv's, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${BATON_IMAGE:-baton:local}"
SANDBOX_IMAGE="${BATON_SANDBOX_IMAGE:-baton-sandbox:local}"
export BATON_BASE_IMAGE="${BATON_BASE_IMAGE:-baton-base:bookworm}"
CACHE="${BATON_DOCKER_CACHE:-/var/cache/baton}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

say() { echo "build_image: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
t0=$(date +%s)

# --- 1. engine + base ----------------------------------------------------------------------
# Only the sandbox image's name is changed here; the base tag is the one exported above.
scripts/docker_setup.sh || die "docker setup (engine + base image)"

# --- 2. wheelhouse -------------------------------------------------------------------------
key=$(cat pyproject.toml server-dist/pyproject.toml requirements.lock scripts/image_requirements.py | sha256sum | cut -c1-16)
house="$CACHE/wheelhouse-$key"
if [ ! -f "$house/.complete" ]; then
    say "building the wheelhouse $house"
    rm -rf "$house" && mkdir -p "$house"
    reqs=$(mktemp)
    "$PYTHON" scripts/image_requirements.py server,docker,kubernetes,cli >"$reqs"
    # Not -q: building the wheelhouse takes minutes the first time; pip names each package.
    "$PYTHON" -m pip wheel --progress-bar off --disable-pip-version-check --constraint requirements.lock \
        --requirement "$reqs" --wheel-dir "$house" || die "pip wheel"
    # The build backend of pyproject.toml's [build-system] (the project is built in the image).
    "$PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' >"$reqs"
    "$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: --requirement "$reqs" \
        --dest "$house" || die "pip download (build backend)"
    rm -f "$reqs"
    touch "$house/.complete"
fi
find wheelhouse -maxdepth 1 -type f -name '*.whl' -delete
cp -p "$house"/*.whl wheelhouse/

# --- 3. images -----------------------------------------------------------------------------
# Progress, not minutes of silence: each Dockerfile step as it starts, with the seconds since
# this build began (BATON_BUILD_LOG=full: every line the build prints). The whole output goes
# to a log whose tail is shown when the build fails.
build() {
    local start log
    start=$(date +%s)
    log=$(mktemp)
    DOCKER_BUILDKIT=0 docker build --build-arg BASE="$BATON_BASE_IMAGE" --build-arg OFFLINE=1 "$@" . 2>&1 \
        | tee "$log" | while IFS= read -r line; do
            case "$line" in
                Step\ *) say "  +$(( $(date +%s) - start ))s ${line:0:150}" ;;
                *) if [ "${BATON_BUILD_LOG:-steps}" = full ]; then echo "    $line" >&2; fi ;;
            esac
        done || { tail -n 40 "$log" >&2; rm -f "$log"; return 1; }
    say "  done in $(( $(date +%s) - start ))s"
    rm -f "$log"
}
say "docker build $SANDBOX_IMAGE (target sandbox)"
build --target sandbox -t "$SANDBOX_IMAGE" || die "docker build --target sandbox"
say "docker build $IMAGE"
build -t "$IMAGE" || die "docker build"
docker run --rm "$IMAGE" baton --help >/dev/null || die "image smoke test (baton --help)"
say "images $IMAGE and $SANDBOX_IMAGE built in $(( $(date +%s) - t0 ))s"
