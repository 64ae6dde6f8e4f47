"""A verl (Hydra) PPO config mapped to rlkube's trainer configuration, or to an RLJob
(`rlkube-trainer convert verl-config.yaml`).

Pure and table-driven: `RULES` says, for every verl key rlkube knows, where it goes
(`To`) or why it has no counterpart (`Ignored`, refused when its value asks for
something rlkube does not do). A key in no rule is refused by name, never dropped in
silence. Hydra's `${a.b}` interpolations are resolved against the same file first.

verl's layout: `actor_rollout_ref.{model,actor,ref,rollout}`, `critic`, `reward_model`,
`custom_reward_function`, `algorithm`, `data`, `trainer`; rlkube's sections keep
verl's leaf names (rlkube_api.config), so most rules only move a key up a level.

Modules: `keys` (what a rule says, shared reasons and conversions), `rules_actor_rollout_ref`
and `rules_sections` (the tables, by verl section), `rules` (them joined), `resolve` (Hydra
interpolation), `conversion` (the mapping, and the RLJob), `command` (the command line).
This face re-exports their public names.
"""

from rlkube_api.verl.conversion import CHECKPOINT_MOUNT, Conversion, checkpoint_claim_of, convert, to_rljob
from rlkube_api.verl.keys import Ignored, Rule, To
from rlkube_api.verl.resolve import VerlConfigError, resolve
from rlkube_api.verl.rules import RULES

__all__ = [
    "CHECKPOINT_MOUNT",
    "RULES",
    "Conversion",
    "Ignored",
    "Rule",
    "To",
    "VerlConfigError",
    "checkpoint_claim_of",
    "convert",
    "resolve",
    "to_rljob",
]
