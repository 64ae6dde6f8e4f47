"""RL post-training math: advantage estimators, policy and value losses, loss aggregation, KL.

Pure torch functions with the names, argument names and defaults of verl's ``core_algos``
(volcengine/verl 0.9.1), so a verl recipe maps over one to one; one module per kind (per
family where a kind has many), each registry beside the functions it holds; importing the package
imports every module, which registers every estimator and loss:

- ``advantage``: the estimators' names and registry, ``register_adv_est`` /
  ``get_adv_estimator_fn``; the estimators by family in ``advantage_returns``,
  ``advantage_group`` and ``advantage_optimal_baseline``
- ``policy_loss``: the policy losses' registry, ``register_policy_loss`` / ``get_policy_loss_fn``;
  the losses by family in ``policy_loss_ppo``, ``policy_loss_sequence``,
  ``policy_loss_covariance`` and ``policy_loss_unclipped``
- ``entropy``: the entropy bonus
- ``value_loss``: the critic's clipped value loss
- ``aggregation``: ``agg_loss`` (``loss_agg_mode``)
- ``kl``: KL estimators, KL controllers, KL in the reward
- ``masked``: masked reductions and group statistics they share

Shapes are ``[batch, response_len]`` unless noted; ``response_mask`` is 1 on generated
tokens and 0 on padding (and on tool/user turns inside a multi-turn response).
"""

from rlkube_trainer.algos.advantage import *  # noqa: F403
from rlkube_trainer.algos.advantage_group import *  # noqa: F403
from rlkube_trainer.algos.advantage_optimal_baseline import *  # noqa: F403
from rlkube_trainer.algos.advantage_returns import *  # noqa: F403
from rlkube_trainer.algos.aggregation import *  # noqa: F403
from rlkube_trainer.algos.entropy import *  # noqa: F403
from rlkube_trainer.algos.kl import *  # noqa: F403
from rlkube_trainer.algos.masked import *  # noqa: F403
from rlkube_trainer.algos.policy_loss import *  # noqa: F403
from rlkube_trainer.algos.policy_loss_covariance import *  # noqa: F403
from rlkube_trainer.algos.policy_loss_ppo import *  # noqa: F403
from rlkube_trainer.algos.policy_loss_sequence import *  # noqa: F403
from rlkube_trainer.algos.policy_loss_unclipped import *  # noqa: F403
from rlkube_trainer.algos.registry import *  # noqa: F403
from rlkube_trainer.algos.value_loss import *  # noqa: F403
