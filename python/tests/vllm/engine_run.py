"""One fresh vLLM engine, run as its own process by the connector tests (a
fresh engine has an empty prefix cache of its own, and vLLM's process-wide
state starts clean). Prints one JSON line: the greedy output tokens, the
tokens vLLM counted as cached, and (in-process mode) the connector's own
counters.

    python engine_run.py '{"model": DIR, "prompt": [ids], "strata": {extra config} | null}'
"""

import json
import os
import sys


def main() -> None:
    args = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = dict(
        model=args["model"],
        dtype="float32",
        block_size=32,
        max_model_len=2048,
        enforce_eager=True,
        # BUILD-NOTES: without a cap vLLM takes ~90% of RAM for its cache.
        kv_cache_memory_bytes=128 << 20,
        seed=0,
    )
    if args.get("strata") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="StrataConnector",
            kv_connector_module_path="strata.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=args["strata"],
        )
    llm = LLM(**kw)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": args["prompt"]}], params, use_tqdm=False)[0]
    totals = None
    if args.get("strata") is not None and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        totals = get_kv_transfer_group().totals()
    print(json.dumps({
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "totals": totals,
    }), flush=True)


if __name__ == "__main__":
    main()
