"""The ConfigMap holding the trainer's configuration, rendered from the spec."""

from __future__ import annotations

from typing import Any

import yaml

from rlkube_api.config import TrainerConfig
from rlkube_api.names import AGENT_DIR, CONFIG_FILE, REWARD_DIR, config_map_name
from rlkube_api.rljob import RLJob
from rlkube_operator.children.labels import job_labels


def trainer_config(job: RLJob) -> TrainerConfig:
    """The spec's trainer sections, with paths as the pods see them."""
    config = job.spec.trainer_config()
    function = config.reward.function
    if function is not None and function.config_map is not None:
        # The ConfigMap key is mounted as a file (see statefulset.reward_volume).
        path = f"{REWARD_DIR}/{function.config_map.key}"
        config.reward.function = function.model_copy(update={"path": path, "config_map": None})
    multi_turn = config.rollout.multi_turn
    if multi_turn.config_map is not None:
        # The paths are keys of the ConfigMap, mounted whole (see statefulset.volumes_and_mounts).
        keys = {
            "tool_config_path": multi_turn.tool_config_path,
            "function_tool_path": multi_turn.function_tool_path,
            "interaction_config_path": multi_turn.interaction_config_path,
        }
        paths = {field: f"{AGENT_DIR}/{key}" for field, key in keys.items() if key is not None}
        config.rollout.multi_turn = multi_turn.model_copy(update={**paths, "config_map": None})
    return config


def config_map(job: RLJob) -> dict[str, Any]:
    text = yaml.safe_dump(trainer_config(job).to_config(), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(job.metadata.name or ""),
            "namespace": job.metadata.namespace,
            "labels": job_labels(job),
        },
        "data": {CONFIG_FILE: text},
    }
