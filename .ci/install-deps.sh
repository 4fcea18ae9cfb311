#!/usr/bin/env bash
# Installs the system packages the tests need:
# - Debian's etcd 3.4 server and etcdctl: the differential oracle (tests/etcdctl.rs) and
#   the other side of the server benchmark (docs/benchmarks-server.md);
# - protoc and the protobuf well-known types (protobuf-compiler, libprotobuf-dev): the
#   etcd-client crate (dev-dependency of tests/client_crate.rs) runs protoc in its build
#   script. /usr/bin/protoc is on PATH and finds /usr/include/google/protobuf by itself,
#   so no PROTOC variable is needed;
# - a C++ compiler (g++, which brings gcc): cargo-fuzz's libfuzzer-sys compiles libFuzzer for
#   the fuzz step, and the ring crate (rustls's crypto provider) compiles its C and assembly;
# - curl: the TLS tests (tests/server/server_tls.rs) fetch /health over HTTPS with it.
# Idempotent: when every binary and file is already there it does nothing, so it is cheap
# to call from every CI run.
set -euo pipefail

have_all() {
    command -v etcd >/dev/null 2>&1 &&
        command -v etcdctl >/dev/null 2>&1 &&
        command -v protoc >/dev/null 2>&1 &&
        command -v g++ >/dev/null 2>&1 &&
        command -v gcc >/dev/null 2>&1 &&
        command -v curl >/dev/null 2>&1 &&
        [ -f /usr/include/google/protobuf/descriptor.proto ]
}

if have_all; then
    echo "install-deps: etcd, etcdctl and protoc already installed ($(etcd --version 2>/dev/null | head -n 1); $(protoc --version))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
    etcd-server etcd-client protobuf-compiler libprotobuf-dev g++ curl

have_all
echo "install-deps: installed $(etcd --version 2>/dev/null | head -n 1); $(protoc --version)"
