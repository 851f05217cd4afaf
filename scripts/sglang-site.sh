#!/usr/bin/env bash
# Makes (once) the directory SGLang's classes are imported from by the
# SGLang backend's tests: sglang 0.5.23 without its dependencies (its wheel
# pins CUDA-only packages and torch 2.14.1) plus the few pure-Python
# packages its memory-pool and storage modules import, installed with
# `pip --target` beside the vLLM venv's torch 2.13.0 (scripts/vllm-venv.sh),
# outside the clone so reruns are warm (~40 MB download). Put on PYTHONPATH
# only for those tests: the vLLM venv itself stays as vLLM needs it.
# Prints the directory's path. Idempotent.
#   scripts/sglang-site.sh
set -euo pipefail
cd "$(dirname "$0")/.."
site="${STRATA_SGLANG_SITE:-$HOME/.cache/strata-sglang/site}"
stamp="$site/.strata-sglang-0.5.23"
exec 3>&1 1>&2
venv="$(scripts/vllm-venv.sh)"
if [ ! -f "$stamp" ]; then
  echo "installing SGLang's classes into $site (one time)"
  rm -rf "$site"
  # torchvision matches the venv's torch 2.13.0; ninja builds SGLang's page
  # hash extension (torch.utils.cpp_extension, cached in ~/.cache/torch_extensions);
  # the rest is what importing sglang.srt.mem_cache asks for on a CPU.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$site" \
    "sglang==0.5.23" "orjson==3.13.0" "ipython==9.18.1" "traitlets==5.16.1" \
    "gguf==0.19.0" "torchvision==0.28.0" "ninja==1.13.2"
  PATH="$site/bin:$PATH" PYTHONPATH="$site" "$venv/bin/python" -W ignore -c '
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str
assert len(get_storage_hash_str(list(range(32)), None, page_size=16)) == 2
'
  touch "$stamp"
fi
echo "$site" >&3
