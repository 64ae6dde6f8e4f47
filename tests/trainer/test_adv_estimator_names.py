"""The advantage estimators' names are written once, in the API (rlkube_api.config.ADV_ESTIMATORS,
the values algorithm.advEstimator admits): the trainer registers a function under each of them
and under no other, and the API's subsets match what the registered functions take."""

from __future__ import annotations

from rlkube_api.config import ADV_ESTIMATORS, GROUP_ESTIMATORS, SUM_PI_SQUARED_ESTIMATORS
from rlkube_trainer.algos import AdvantageEstimator, takes
from rlkube_trainer.algos.advantage import ADV_ESTIMATOR_REGISTRY


def test_every_api_name_is_registered_and_every_registered_name_is_in_the_api() -> None:
    assert len(set(ADV_ESTIMATORS)) == len(ADV_ESTIMATORS)
    unregistered = sorted(set(ADV_ESTIMATORS) - set(ADV_ESTIMATOR_REGISTRY))
    unadmitted = sorted(set(ADV_ESTIMATOR_REGISTRY) - set(ADV_ESTIMATORS))
    assert not unregistered, f"the API admits estimators the trainer has no function for: {unregistered}"
    assert not unadmitted, f"the trainer registers estimators the API refuses: {unadmitted}"


def test_verls_enum_names_the_same_estimators() -> None:
    assert sorted(member.value for member in AdvantageEstimator) == sorted(ADV_ESTIMATORS)


def test_the_apis_subsets_are_the_estimators_that_take_their_inputs() -> None:
    # A group estimator reads the group index (so rollout.samplesPerPrompt must be 2 or more);
    # the optimal token baselines read the actor's sum of pi^2.
    def taking(argument: str) -> set[str]:
        return {name for name in ADV_ESTIMATORS if takes(ADV_ESTIMATOR_REGISTRY[name], argument)}

    assert taking("index") == set(GROUP_ESTIMATORS)
    assert taking("sum_pi_squared") == set(SUM_PI_SQUARED_ESTIMATORS)
