"""One fresh vLLM engine, as its own process (a fresh engine has an empty
prefix cache, and vLLM's process-wide state starts clean): what the vLLM
connector's tests and ``python -m strata.bench.vllm`` run. Prints one JSON
line: the greedy output tokens, the tokens vLLM counted as cached, the time
the timed request took, and (in-process mode) the Strata connector's own
counters.

    python -m strata.bench.vllm_engine '{"model": DIR, "prompt": [ids],
        "strata": {extra config} | null, "connector": {KVTransferConfig} | null,
        "max_tokens": 16, "warmup": false, "repeat": false, "max_model_len": 2048}'
"""

import json
import os
import sys
import time

# What every engine run gets (BUILD-NOTES): offline, no usage reports.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "TOKENIZERS_PARALLELISM": "false"}


def main() -> None:
    args = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = dict(
        model=args["model"],
        dtype="float32",
        block_size=32,
        max_model_len=int(args.get("max_model_len", 2048)),
        enforce_eager=True,
        # BUILD-NOTES: without a cap vLLM takes ~90% of RAM for its cache.
        kv_cache_memory_bytes=int(args.get("kv_cache_bytes", 128 << 20)),
        seed=0,
    )
    if args.get("strata") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="StrataConnector",
            kv_connector_module_path="strata.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=args["strata"],
        )
    elif args.get("connector") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(**args["connector"])
    llm = LLM(**kw)
    params = SamplingParams(max_tokens=int(args.get("max_tokens", 16)), temperature=0.0, ignore_eos=True)
    if args.get("warmup"):
        # Lazy initialisation out of the timed request: a short prompt of
        # other tokens, shorter than a block (nothing stored or shared).
        llm.generate([{"prompt_token_ids": [5] * 20}], SamplingParams(max_tokens=2), use_tqdm=False)
    if args.get("repeat"):
        # The same prompt once first: the timed request finds it in vLLM's
        # own prefix cache.
        llm.generate([{"prompt_token_ids": args["prompt"]}], params, use_tqdm=False)
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": args["prompt"]}], params, use_tqdm=False)[0]
    took = time.perf_counter() - t0
    totals = None
    if args.get("strata") is not None and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        totals = get_kv_transfer_group().totals()
    print(json.dumps({
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "seconds": took,
        "totals": totals,
    }), flush=True)


if __name__ == "__main__":
    main()
