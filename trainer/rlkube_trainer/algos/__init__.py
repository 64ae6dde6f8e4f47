"""RL post-training math: advantage estimators, policy and value losses, loss aggregation, KL.

Pure torch functions with the names, argument names and defaults of verl's ``core_algos``
(volcengine/verl 0.9.1), so a verl recipe maps over one to one; one module per kind, each
registry beside its functions:

- ``advantage``: estimators, ``register_adv_est`` / ``get_adv_estimator_fn``
- ``policy_loss``: policy losses, ``register_policy_loss`` / ``get_policy_loss_fn``, entropy
- ``value_loss``: the critic's clipped value loss
- ``aggregation``: ``agg_loss`` (``loss_agg_mode``)
- ``kl``: KL estimators, KL controllers, KL in the reward
- ``masked``: masked reductions and group statistics they share

Shapes are ``[batch, response_len]`` unless noted; ``response_mask`` is 1 on generated
tokens and 0 on padding (and on tool/user turns inside a multi-turn response).
"""

from rlkube_trainer.algos.advantage import *  # noqa: F403
from rlkube_trainer.algos.aggregation import *  # noqa: F403
from rlkube_trainer.algos.kl import *  # noqa: F403
from rlkube_trainer.algos.masked import *  # noqa: F403
from rlkube_trainer.algos.policy_loss import *  # noqa: F403
from rlkube_trainer.algos.registry import *  # noqa: F403
from rlkube_trainer.algos.value_loss import *  # noqa: F403
