"""Llama models made on the spot, for the engine tests and benchmarks: a
byte-level BPE tokenizer trained on local text and random weights, saved
the way Hugging Face saves a model, so an engine loads them as it loads any
model. Nothing is downloaded.

Needs ``torch``, ``transformers`` and ``tokenizers`` (an engine's venv has
them)."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator

# What a test needs to tell its engines' outputs apart: tiny, and fast to
# make (seconds).
TINY = dict(hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2)
# What costs real prefill time on a CPU: ~0.3 B parameters.
PREFILL = dict(hidden=1024, intermediate=4096, layers=20, heads=16, kv_heads=4)


def _training_text(limit: int = 512 * 1024) -> Iterator[str]:
    """Python's own standard library sources: on every machine, English
    comments and code, a few hundred KB."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for p in sorted(root.glob("*.py")):
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text
        total += len(text)
        if total >= limit:
            return


def make_llama(
    out: Path,
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int = 1024,
    max_positions: int = 8192,
    seed: int = 0,
    std: float = 0.08,
) -> Path:
    """Writes a random ``LlamaForCausalLM`` and its tokenizer to ``out``.

    Weights are drawn from N(0, ``std``) — wider than the default init, so
    greedy decoding is decided by clear margins, not near-ties that differ
    between kernels — except the norms, which stay 1. The same arguments
    give the same model."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)

    head_dim = hidden // heads
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, std)
    model.save_pretrained(out, safe_serialization=True)
    return out
