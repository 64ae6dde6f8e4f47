"""rollout.harness: an agent harness of the user's, a program of its own, drives the rollout
through an OpenAI-compatible endpoint on the driver (rlkube's own section; verl 0.9.1 runs only
agent loops inside its workers)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from rlkube_api.base import ApiModel

Argument = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class HarnessConfig(ApiModel):
    """One process of `command` per episode (each of a batch's prompts, samplesPerPrompt times),
    started by the driver with OPENAI_BASE_URL and OPENAI_API_KEY set for an `openai` client,
    RLKUBE_EPISODE (the row: prompt messages, data_source, ground_truth, extra_info) and
    RLKUBE_REWARD_URL (where it POSTs {"reward": x}). Every call's tokens and log-probs are
    recorded as the engine produced them and trained on; the episode's reward reaches the reward
    function as extra_info["harness_reward"], and is the score when no reward function is set. A
    GRPO group with a lost episode (a crash, a timeout, no call, no reward) is left out of the
    step and counted in rollout/episodes_lost and rollout/groups_dropped."""

    command: list[Argument] = Field(
        min_length=1,
        max_length=256,
        description="The harness's argv (a program in the trainer's image, e.g. [python, /app/agent.py]); run "
        "in the driver's container, which serves the endpoint on its loopback interface only.",
    )
    timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="Limit of one episode from its process's start: past it the process group is killed and the "
        "episode lost.",
    )
    require_reward: bool = Field(
        True,
        description="An episode whose harness reports no reward is lost (true), or trained on with "
        "extra_info.harness_reward null, scored by reward.function, reward.model or reward.remote (false).",
    )
    max_concurrent_episodes: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Harness processes running at once; the next starts when one ends (unset: every episode of "
        "a batch at once). Their engine calls are batched whatever this is.",
    )
