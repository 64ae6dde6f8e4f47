"""RULES: for every verl key rlkube knows, where it goes or why it has no counterpart. A key in
no rule is refused by name (conversion.convert), never dropped in silence."""

from __future__ import annotations

from rlkube_api.verl.keys import Rule
from rlkube_api.verl.rules_actor_rollout_ref import ACTOR_ROLLOUT_REF_RULES
from rlkube_api.verl.rules_sections import ALGORITHM_RULES, CRITIC_RULES, DATA_RULES, REWARD_RULES, TRAINER_RULES

RULES: dict[str, Rule] = {
    **DATA_RULES,
    **ACTOR_ROLLOUT_REF_RULES,
    **CRITIC_RULES,
    **REWARD_RULES,
    **ALGORITHM_RULES,
    **TRAINER_RULES,
}
