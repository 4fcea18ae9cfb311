#!/usr/bin/env bash
# Installs the system packages the integration tests need: Debian's etcd 3.4 server and
# etcdctl (the differential oracle, tests/etcdctl.rs). Idempotent: when both binaries are
# already on PATH it does nothing, so it is cheap to call from every CI run.
set -euo pipefail

if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
    echo "install-deps: etcd and etcdctl already installed ($(etcd --version 2>/dev/null | head -n 1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends etcd-server etcd-client

command -v etcd >/dev/null
command -v etcdctl >/dev/null
echo "install-deps: installed $(etcd --version 2>/dev/null | head -n 1)"
