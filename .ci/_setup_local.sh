#!/usr/bin/env bash
# CI entry point: install what the suite needs on a fresh machine, then run `make test`,
# exactly the command README.md gives a newcomer.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-true}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
# Printed on failure too, so a slow or red run still says where its time went.
trap 'echo "ci: finished (exit $?) in $(( $(date +%s) - start ))s"' EXIT

# Every prerequisite the suite uses must be here: a missing one fails the run with its name
# (tests/conftest.py `require` also turns the tests' skips into failures under CI=true).
fail() { echo "ci: FAILED: $*" >&2; exit 1; }

# tests/deploy validates compose.yaml with Debian's docker-compose (`docker-compose config`);
# tests/node/browser.mjs drives Debian's chromium with playwright-core; tests/node needs npm.
need=()
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
# tests/deploy/test_k8s.py renders deploy/k8s with `kubectl kustomize` (the machine's apt
# source for it; Debian's kubernetes-client 1.20 embeds a kustomize too old for `labels:`).
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
[ -x /usr/bin/chromium ] || need+=(chromium)
# tests/grpc/test_go_client.py builds examples/go with Debian's Go and grpc-go in GOPATH mode
# (the Go module proxy is not reachable) and generates its stubs with protoc at test time.
command -v go >/dev/null 2>&1 || need+=(golang-go)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v protoc-gen-go-grpc >/dev/null 2>&1 || need+=(protoc-gen-go-grpc)
[ -d /usr/share/gocode/src/google.golang.org/grpc ] || need+=(golang-google-grpc-dev)
[ -d /usr/share/gocode/src/google.golang.org/protobuf ] || need+=(golang-google-protobuf-dev)
{ command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; } || need+=(nodejs npm)
if [ "${#need[@]}" -gt 0 ]; then
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
  # Other jobs on the machine may hold the dpkg lock: wait for it instead of failing.
  ("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq \
     && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
          "${need[@]}" >/dev/null) \
    || fail "could not install ${need[*]} (apt-get)"
fi
command -v docker-compose >/dev/null 2>&1 || fail "docker-compose missing after install"
command -v kubectl >/dev/null 2>&1 || fail "kubectl missing after install"
[ -x /usr/bin/chromium ] || fail "/usr/bin/chromium missing after install"
command -v node >/dev/null 2>&1 || fail "node missing after install"
command -v npm >/dev/null 2>&1 || fail "npm missing after install"

# tests/docker need a real engine and the offline sandbox image (Debian docker.io, dockerd,
# debootstrap + docker import); the same import is the base of the offline service image
# that `make test-deploy` builds.
scripts/docker_setup.sh || fail "docker setup (engine + sandbox image): see scripts/docker_setup.sh output above"
export BATON_TEST_DOCKER=1

# The npm packages of tests/node (make test installs them too; here a failure is named).
make --no-print-directory node-deps || fail "npm install in tests/node"
[ -d tests/node/node_modules ] || fail "tests/node/node_modules missing after make node-deps"
# The TypeScript client package (clients/typescript): npm ci, types generated with protoc, tsc.
make --no-print-directory ts-client || fail "build of clients/typescript"
[ -f clients/typescript/dist/index.js ] || fail "clients/typescript/dist missing after make ts-client"

echo "ci: setup done in $(( $(date +%s) - start ))s"
