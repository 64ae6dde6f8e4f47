"""Rollout with plain `transformers` generation: the fallback where vLLM is missing or unsuitable.

Much slower than vLLM (no paged KV cache or continuous batching) but dependency-free and exact:
useful for debugging, for architectures vLLM lacks, and as a reference in tests.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlkube_trainer.rollout.base import (
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
    check_prompts,
    streamed,
)

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFRolloutEngine(RolloutEngine):
    """`AutoModelForCausalLM.generate` behind the `RolloutEngine` interface.

    `max_batch_size` bounds the number of prompts per `generate` call (each expands to n sequences).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 64,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not Path(model_path).exists():
            raise FileNotFoundError(f"model path {model_path} does not exist")
        self._device = torch.device(device)
        self._max_batch_size = max_batch_size

        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=_DTYPES[dtype])
        # Stop on every end-of-sequence id the checkpoint names, as vLLM does (chat models list
        # several in generation_config.json, e.g. <|im_end|> and <|endoftext|>).
        eos: list[int] = []
        for candidate in (tokenizer.eos_token_id, model.generation_config.eos_token_id):
            for token in candidate if isinstance(candidate, list) else [candidate]:
                if token is not None and token not in eos:
                    eos.append(int(token))
        if not eos:
            raise ValueError(f"{model_path}: neither the tokenizer nor generation_config names an EOS token")
        self._eos_ids = eos
        self._pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else eos[0]
        # generate() fills every setting a call leaves unset from the checkpoint's
        # generation_config.json (a chat model's repetition_penalty, top_k, min_p, ...): a blank
        # one makes sampling exactly what SamplingConfig says.
        model.generation_config = GenerationConfig()  # type: ignore[no-untyped-call]
        self._model: Any = model.to(self._device).eval()
        self._asleep = False

    def _live_model(self) -> Any:
        if self._model is None:
            raise RuntimeError("the HF rollout engine is closed")
        if self._asleep:
            raise RuntimeError("the HF rollout engine is asleep: call wake_up() first")
        return self._model

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> RolloutBatch:
        model = self._live_model()
        check_prompts(prompt_token_ids)
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=sampling.max_tokens,
            do_sample=not sampling.greedy,
            # Neutral values under greedy decoding, where they are ignored anyway.
            temperature=1.0 if sampling.greedy else sampling.temperature,
            top_k=0 if sampling.top_k == -1 or sampling.greedy else sampling.top_k,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            num_return_sequences=sampling.n,
            eos_token_id=None if sampling.ignore_eos else self._eos_ids,
            pad_token_id=self._pad_id,
            output_scores=sampling.logprobs,
            return_dict_in_generate=True,
        )
        samples: list[RolloutSample] = []
        for start in range(0, len(prompt_token_ids), self._max_batch_size):
            chunk = prompt_token_ids[start : start + self._max_batch_size]
            samples.extend(self._generate_chunk(model, chunk, start, config, sampling))
        return RolloutBatch(samples=samples, n=sampling.n)

    def _generate_chunk(
        self,
        model: Any,
        prompts: list[list[int]],
        first_index: int,
        config: Any,
        sampling: SamplingConfig,
    ) -> list[RolloutSample]:
        # Left padding: every prompt then ends at the same column and generation appends after it.
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1

        # A private RNG stream per chunk, so seeded rollouts are reproducible without disturbing the
        # trainer's global RNG state.
        devices = [self._device] if self._device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed + first_index)
            out = model.generate(
                input_ids=input_ids.to(self._device),
                attention_mask=attention_mask.to(self._device),
                generation_config=config,
            )
        responses = out.sequences[:, width:].cpu()
        # One (sequences, vocab) tensor per step: log-softmax step by step rather than stacking them,
        # which would hold sequences x steps x vocab floats at once.
        token_logprobs: torch.Tensor | None = None
        if sampling.logprobs:
            steps = [
                torch.log_softmax(scores.float(), dim=-1).gather(1, responses[:, t : t + 1].to(scores.device))
                for t, scores in enumerate(out.scores)
            ]
            token_logprobs = torch.cat(steps, dim=1).cpu()

        eos = set(self._eos_ids)
        samples: list[RolloutSample] = []
        for row in range(responses.shape[0]):
            tokens = responses[row].tolist()
            length = len(tokens)
            finish_reason: FinishReason = "length"
            if not sampling.ignore_eos:
                # After a sequence stops, generate() pads it to the batch's longest with pad ids.
                for t, token in enumerate(tokens):
                    if token in eos:
                        length, finish_reason = t + 1, "stop"
                        break
            samples.append(
                RolloutSample(
                    prompt_index=first_index + row // sampling.n,
                    token_ids=tokens[:length],
                    logprobs=None if token_logprobs is None else token_logprobs[row, :length].tolist(),
                    finish_reason=finish_reason,
                )
            )
        return samples

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], names: Collection[str] | None = None
    ) -> None:
        model = self._live_model()
        if names is None:
            weights = list(named_tensors)
            names, named_tensors = [name for name, _ in weights], weights
        current = model.state_dict(keep_vars=True)
        unknown = set(names) - set(current)
        # A name counts as given if any name sharing its storage is given: tied weights appear
        # twice in state_dict() but once in named_parameters().
        by_storage: dict[int, set[str]] = {}
        for name, tensor in current.items():
            by_storage.setdefault(tensor.data_ptr(), set()).add(name)
        missing = {name for name, tensor in current.items() if not by_storage[tensor.data_ptr()] & set(names)}
        if unknown or missing:
            raise ValueError(
                "update_weights needs every parameter of the model under its Hugging Face name "
                f"(as from model.named_parameters()); unknown: {sorted(unknown)[:10]}, "
                f"missing: {sorted(missing)[:10]}"
            )
        # Each tensor copied (cast, moved) into the one it replaces as it comes.
        with torch.no_grad():
            for name, tensor in streamed(named_tensors, names):
                if tensor.shape != current[name].shape:
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                        f"{tuple(current[name].shape)}"
                    )
                current[name].copy_(tensor)

    def reset_prefix_cache(self) -> None:
        # generate() keeps no KV cache across calls.
        pass

    def sleep(self) -> None:
        model = self._live_model()
        if self._device.type != "cuda":
            logger.info("HF rollout engine on %s has no accelerator memory to free; sleep() does nothing", self._device)
            return
        model.to("cpu")
        torch.cuda.empty_cache()
        self._asleep = True

    def wake_up(self) -> None:
        if self._model is None:
            raise RuntimeError("the HF rollout engine is closed")
        if not self._asleep:
            if self._device.type != "cuda":
                logger.info("HF rollout engine on %s never sleeps; wake_up() does nothing", self._device)
            return
        self._model.to(self._device)
        self._asleep = False

    def close(self) -> None:
        if self._model is None:
            return
        self._model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
