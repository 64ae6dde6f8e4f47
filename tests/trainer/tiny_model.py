"""A tiny random-initialised Qwen2 causal LM with a locally built tokenizer.

Tests must not download anything (no hub access here or in CI), so both the model and the tokenizer
are made from scratch: the model from a small `Qwen2Config`, the tokenizer as a byte-level BPE with
no merges (every byte is one token), which round-trips any text with a vocabulary of a few hundred.
vLLM and transformers both load the saved directory like any hub checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from rlkube_trainer.rollout import RolloutEngine, build_rollout_engine

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen-style ChatML, so prompts built with `apply_chat_template` look like a real chat model's.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer whose vocabulary is exactly `vocab` ids.

    The vocabulary is padded with unused `<|extra_N|>` tokens up to the model's size: every id the
    model can sample then decodes to something, which keeps vLLM's detokenizer out of trouble.
    """
    byte_alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_fixed = len(byte_alphabet) + len(SPECIAL_TOKENS)
    if vocab < n_fixed:
        raise ValueError(f"vocab must be at least {n_fixed} (256 bytes + {len(SPECIAL_TOKENS)} specials)")
    token_to_id = {tok: i for i, tok in enumerate(byte_alphabet)}
    extras = [f"<|extra_{i}|>" for i in range(vocab - n_fixed)]
    for tok in (*SPECIAL_TOKENS, *extras):
        token_to_id[tok] = len(token_to_id)

    backend = Tokenizer(models.BPE(vocab=token_to_id, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([*SPECIAL_TOKENS, *extras])

    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    path: str | Path,
    *,
    vocab: int = 512,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    tie_word_embeddings: bool = True,
) -> Path:
    """Save a random-initialised tiny Qwen2 model and its tokenizer to `path`; returns the path.

    vLLM's CPU attention supports head sizes 32, 64, 80, ... only, and vLLM's Qwen2 derives the head
    size as `hidden_size // num_heads` (it ignores `head_dim`), hence 64 hidden with 2 heads.
    Embeddings are tied by default, as in the small Qwen2.5 models, so weight syncing is exercised
    on the case where HF names `lm_head.weight` but the checkpoint only stores the embedding.
    """
    if hidden_size // num_heads < 32:
        raise ValueError(
            f"hidden_size / num_heads must be at least 32 for vLLM's CPU attention, got {hidden_size} / {num_heads}"
        )
    path = Path(path)
    tokenizer = build_tokenizer(vocab)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    # Random init at std 0.02 gives near-uniform next-token distributions; a wider spread makes the
    # greedy continuations depend clearly on the weights, which the weight-sync tests rely on.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# A sequence-classification reward model with a byte-level tokenizer and a chat template.
RM_SPECIALS = ["[PAD]", "</s>", "<|user|>", "<|assistant|>"]
RM_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"


def save_reward_model(path: Path, causal_lm: bool = False) -> Path:
    # Byte-level BPE without merges (one token per byte): transformers 5 loads a qwen2 checkpoint's
    # tokenizer as Qwen2Tokenizer, which keeps the vocabulary but imposes byte-level pre-tokenization.
    vocab = {token: i for i, token in enumerate([*RM_SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(RM_SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="[PAD]")
    tokenizer.chat_template = RM_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=vocab["[PAD]"],
        eos_token_id=vocab["</s>"],
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config) if causal_lm else Qwen2ForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def teach(path: Path, texts: list[str], steps: int, lr: float = 3e-3) -> float:
    """Supervised steps of the saved model at `path` on `texts` (whole sequences, one batch of
    equal token lengths), saved back; returns the last loss. Tests use it to give a random model
    a behaviour RL alone would need far longer to find (writing a tool call)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    sequences = torch.tensor([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts])
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(sequences, labels=sequences).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    return float(loss.item())


@contextmanager
def cpu_engine(model_path: Path, max_model_len: int = 256) -> Iterator[RolloutEngine]:
    """The real vLLM CPU engine over a tiny model, as the agent tests share it: float32, eager,
    a 64 MiB KV cache, seeded."""
    with build_rollout_engine(
        "vllm",
        model_path=model_path,
        dtype="float32",
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=max_model_len,
        enforce_eager=True,
        seed=0,
        device="cpu",
    ) as engine:
        yield engine
