"""Validation on held-out rows (data.val_files), with verl's metric names.

Every validation prompt is sampled `rollout.val_kwargs.n` times with the training run's own
engines (greedy by default), scored by the training run's scorer, and summarised as verl's
`process_validation_metrics` does: per data source, per variable (`reward`, and the numeric
entries a reward function returns, such as `acc`), per prompt `mean@N`, `std@N`, and, for
N > 1, bootstrap estimates of `best@n`, `worst@n` and (when the scorer returns `pred`)
`maj@n` for n = 2, 4, ... and N; then averaged over prompts. The headline metrics,
`val-core/<data_source>/<var>/{mean,best,maj}@N` of the core variable (`acc` if present,
else `reward`), go under `val-core/`, the rest under `val-aux/`.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from rlkube_api.config import TrainerConfig
from rlkube_trainer.checkpoint.volume import append_row
from rlkube_trainer.data.prompts import Prompt, PromptDataset
from rlkube_trainer.loop.ppo import PPOTrainer
from rlkube_trainer.loop.scored import Scored
from rlkube_trainer.loop.tracking import keep_rows_through
from rlkube_trainer.rollout import SamplingConfig

Metrics = dict[str, float]
GENERATIONS_FILE = "validation_generations.jsonl"
# Validation seeds stay clear of the training steps' (ppo.PPOTrainer.sampling).
VALIDATION_SEED_OFFSET = 2**40
_CORE_METRIC = re.compile(r"^val-core/.+/(mean)@\d+$")


# --------------------------------------------------------------------------- the statistics


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[list[Any]], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) of each reduction over `n_bootstrap` resamples (with replacement) of
    `subset_size` items; verl's resampling, numpy's legacy generator seeded with `seed`."""
    rng = np.random.RandomState(seed)
    results: list[list[float]] = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        picked = [data[i] for i in rng.choice(len(data), size=subset_size, replace=True)]
        for out, reduce in zip(results, reduce_fns, strict=True):
            out.append(reduce(picked))
    return [(float(np.mean(r)), float(np.std(r))) for r in results]


def majority_value(votes: list[tuple[float, str]]) -> float:
    """The value of the first sample whose `pred` is the most common (ties: first seen)."""
    counts = Counter(pred for _, pred in votes)
    top = max(counts.values())
    winner = next(pred for _, pred in votes if counts[pred] == top)
    return next(value for value, pred in votes if pred == winner)


def sample_sizes(n: int) -> list[int]:
    """2, 4, 8, ... below n, then n itself."""
    sizes, size = [], 2
    while size < n:
        sizes.append(size)
        size *= 2
    return [*sizes, n]


def prompt_metrics(values: list[float], preds: list[str] | None, seed: int = 42) -> Metrics:
    """One prompt's statistics over its N samples of one variable."""
    n = len(values)
    out: Metrics = {f"mean@{n}": float(np.mean(values))}
    if n == 1:
        return out
    out[f"std@{n}"] = float(np.std(values))
    for size in sample_sizes(n):
        (best_mean, best_std), (worst_mean, worst_std) = bootstrap_metric(values, size, [max, min], seed=seed)
        out[f"best@{size}/mean"], out[f"best@{size}/std"] = best_mean, best_std
        out[f"worst@{size}/mean"], out[f"worst@{size}/std"] = worst_mean, worst_std
        if preds is not None:
            votes = list(zip(values, preds, strict=True))
            [(maj_mean, maj_std)] = bootstrap_metric(votes, size, [majority_value], seed=seed)
            out[f"maj@{size}/mean"], out[f"maj@{size}/std"] = maj_mean, maj_std
    return out


def process_validation_metrics(
    data_sources: Sequence[str],
    prompt_ids: Sequence[str],
    variables: dict[str, list[float]],
    preds: list[str] | None = None,
    seed: int = 42,
) -> dict[str, dict[str, Metrics]]:
    """{data_source: {variable: {metric: value averaged over prompts}}}."""
    grouped: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, prompt) in enumerate(zip(data_sources, prompt_ids, strict=True)):
        grouped[source][prompt].append(i)
    out: dict[str, dict[str, Metrics]] = {}
    for source, prompts in grouped.items():
        per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for rows in prompts.values():
            for name, values in variables.items():
                prompt_preds = [preds[i] for i in rows] if preds is not None else None
                for metric, value in prompt_metrics([values[i] for i in rows], prompt_preds, seed).items():
                    per_var[name][metric].append(value)
        out[source] = {
            name: {metric: float(np.mean(values)) for metric, values in metrics.items()}
            for name, metrics in per_var.items()
        }
    return out


def name_validation_metrics(summary: dict[str, dict[str, Metrics]]) -> Metrics:
    """verl's names: `val-core/<source>/<var>/<metric>` for the core variable's mean, best and
    maj at the largest N, `val-aux/...` for everything else."""
    named: Metrics = {}
    for source, per_var in summary.items():
        core = "acc" if "acc" in per_var else "reward"
        for name, metrics in per_var.items():
            n_max = max(int(m.split("@")[-1].split("/")[0]) for m in metrics)
            for metric, value in metrics.items():
                is_core = name == core and metric.startswith(("mean", "maj", "best")) and f"@{n_max}" in metric
                named[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric}"] = value
    return named


def headline_score(metrics: Metrics) -> float | None:
    """One number for the RLJob status: the core `mean@N` averaged over data sources."""
    values = [v for k, v in metrics.items() if _CORE_METRIC.match(k)]
    return sum(values) / len(values) if values else None


# --------------------------------------------------------------------------- the run


def validation_prompts(config: TrainerConfig, tokenizer: PreTrainedTokenizerBase) -> PromptDataset | None:
    """The prompts of data.val_files, or None when the run does not validate."""
    trainer = config.trainer
    if not config.data.val_files:
        if trainer.test_freq > 0 or trainer.val_only:
            key = "trainer.test_freq" if trainer.test_freq > 0 else "trainer.val_only"
            raise ValueError(f"{key} is set but data.val_files is empty: nothing to validate on")
        return None
    if trainer.test_freq <= 0 and not trainer.val_before_train and not trainer.val_only:
        return None
    return PromptDataset(config.data.val_files, tokenizer, config.data)


@dataclass
class Validation:
    """Samples and scores the validation prompts with the training run's roles."""

    config: TrainerConfig
    prompts: Sequence[Prompt]
    ppo: PPOTrainer
    output_dir: Path

    def sampling(self, step: int) -> SamplingConfig:
        val = self.config.rollout.val_kwargs
        return SamplingConfig(
            n=val.n,
            temperature=val.temperature if val.do_sample else 0.0,
            top_p=val.top_p,
            top_k=val.top_k,
            max_tokens=self.config.data.max_response_length,
            seed=self.config.trainer.seed * 100_003 + step + VALIDATION_SEED_OFFSET,
            ignore_eos=self.config.rollout.ignore_eos,
            logprobs=False,
        )

    def run(self, step: int) -> Metrics:
        chunk = self.config.data.val_batch_size or len(self.prompts)
        sources: list[str] = []
        ids: list[str] = []
        texts: list[str] = []
        parts: list[Scored] = []
        for start in range(0, len(self.prompts), chunk):
            prompts = list(self.prompts[start : start + chunk])
            rollout = self.ppo.generate(prompts, self.sampling(step))
            parts.append(self.ppo.score(prompts, rollout))
            for sample in rollout.samples:
                prompt = prompts[sample.prompt_index]
                sources.append(prompt.data_source)
                ids.append(prompt.uid)
                texts.append(prompt.prompt_text)
        scored = Scored.concat(parts)
        variables = {"reward": scored.scores, **scored.extra}
        preds = scored.labels.get("pred")
        metrics = name_validation_metrics(process_validation_metrics(sources, ids, variables, preds))
        if self.config.trainer.log_val_generations:
            self.log_generations(step, texts, scored)
        return metrics

    def rewind(self, step: int) -> None:
        """Forgets generations logged after `step` (a resumed run redoes those validations)."""
        keep_rows_through(self.output_dir / GENERATIONS_FILE, step)

    def log_generations(self, step: int, inputs: list[str], scored: Scored) -> None:
        """`trainer.log_val_generations` rows, the same prompts at every validation: sorted by
        prompt, shuffled with a fixed seed, the first N (as verl picks them)."""
        rows = sorted(zip(inputs, scored.responses, scored.scores, strict=True))
        order = np.random.RandomState(42).permutation(len(rows))
        for i in order[: self.config.trainer.log_val_generations]:
            prompt, response, score = rows[i]
            row = {"step": step, "input": prompt, "output": response, "score": score}
            append_row(self.output_dir / GENERATIONS_FILE, json.dumps(row))
