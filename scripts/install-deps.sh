#!/usr/bin/env bash
# Installs the Debian packages Strata's build and tests need (idempotent).
#   protobuf-compiler  protoc for the gRPC code generation
#   redis-server       the Redis baseline of `strata bench`
#   curl               admin-endpoint checks in scripts
#   etcd-server        a real etcd for the DurableKv conformance suite (and HA)
#   clang libclang-dev build-essential pkg-config  the bundled RocksDB build (bindgen, C++)
set -euo pipefail
pkgs=(protobuf-compiler redis-server curl clang libclang-dev build-essential pkg-config etcd-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
