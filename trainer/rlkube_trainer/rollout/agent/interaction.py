"""Interactions: user-simulating environments in a multi-turn episode (verl 0.5-0.8's
`verl.interactions`; 0.9.1 dropped the package but keeps `extra_info.interaction_kwargs` rows).

An interaction answers each model turn that ends without a tool call: it returns whether the
episode ends, the user's reply (a user turn, out of the loss like a tool turn) and a turn score.
`interaction_config_path` is verl's YAML: `interaction: [{name, class_name, config}]`; a row picks
one by `extra_info.interaction_kwargs.name` and the other kwargs go to every call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import yaml

from rlkube_trainer.rollout.agent.modules import import_class

# (should_terminate_sequence, response_content, current_turn_score, additional_data), as verl.
InteractionReply = tuple[bool, str, float | None, dict[str, Any]]
KEY = "rollout.multi_turn.interaction_config_path"


class BaseInteraction:
    """verl's `BaseInteraction`: one instance serves every episode; state lives per `instance_id`."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or uuid4().hex

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> InteractionReply:
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_interactions(path: str | Path) -> dict[str, BaseInteraction]:
    """The interactions of verl's config file by name; a class_name's module may be a .py file
    beside the config (a ConfigMap's keys are mounted side by side)."""
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{KEY} {path}: cannot be read: {exc}") from None
    entries = doc.get("interaction") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{KEY} {path}: expected a top-level 'interaction' list of {{name, class_name, config}}")
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{KEY} {path}: interaction[{i}] needs a class_name")
        cls = import_class(str(entry["class_name"]), file.parent, BaseInteraction, f"{KEY} {path}")
        config = dict(entry.get("config") or {})
        # verl: the entry's name, else the class name without "Interaction", lower-cased.
        name = str(entry.get("name") or cls.__name__.removesuffix("Interaction").lower())
        if name in interactions:
            raise ValueError(f"{KEY} {path}: interaction {name!r} is defined twice")
        interactions[name] = cls({**config, "name": name})
    return interactions


def pick_interaction(interactions: dict[str, BaseInteraction], kwargs: dict[str, Any], where: str) -> BaseInteraction:
    """The row's interaction: `interaction_kwargs.name`, or the only one configured."""
    name = kwargs.get("name")
    if name is None:
        if len(interactions) == 1:
            return next(iter(interactions.values()))
        raise ValueError(f"{where}: extra_info.interaction_kwargs.name is required (one of {sorted(interactions)})")
    if name not in interactions:
        raise ValueError(f"{where}: extra_info.interaction_kwargs.name {name!r} is not one of {sorted(interactions)}")
    return interactions[name]
