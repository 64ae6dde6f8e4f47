"""A finished episode as a training sample, as a multi-turn episode becomes one (agent/sampler.py):
the first call's prompt is the sample's prompt, the rest of the chained context its response,
trained only on the completions. Pure."""

from __future__ import annotations

from dataclasses import replace

from rlkube_trainer.rollout.agent.episode import Trajectory
from rlkube_trainer.rollout.agent.sampler import to_sample
from rlkube_trainer.rollout.base import RolloutSample
from rlkube_trainer.rollout.endpoint.recorder import EpisodeRecord
from rlkube_trainer.scorers.harness import HARNESS_REWARD


def training_sample(
    prompt_index: int, record: EpisodeRecord, response_length: int, with_logprobs: bool
) -> RolloutSample:
    """The episode cut to `response_length` tokens (finish_reason "length" then); the harness's
    reward reaches the reward function as extra_info["harness_reward"] (None when it reported none)."""
    traj = record.trajectory
    if traj is None or record.broken:
        raise ValueError(f"episode {record.episode_id} has no trajectory to train on: {record.broken or 'no call'}")
    cut = Trajectory(
        prompt_ids=traj.prompt_ids,
        response_ids=traj.response_ids[:response_length],
        response_mask=traj.response_mask[:response_length],
        response_logprobs=traj.response_logprobs[:response_length],
        assistant_turns=traj.assistant_turns,
        user_turns=traj.user_turns,
    )
    sample = to_sample(prompt_index, cut, response_length, with_logprobs)
    return replace(sample, reward_info={**(sample.reward_info or {}), HARNESS_REWARD: record.reward})
