"""The RLJob and trainer-config models on their own (no cluster)."""

from __future__ import annotations

import operator as stdlib_operator
from pathlib import Path

import pytest
import yaml

from rlkube_api.config import TrainerConfig
from rlkube_api.rljob import RLJob
from rlkube_api.validation import InvalidSpec, check_rljob_update, load_trainer_config, parse_rljob
from tests.api.cases import (
    EXAMPLES,
    IMMUTABLE,
    INVALID,
    ROLLOUT_TRANSITIONS,
    VALID,
    Case,
    Transition,
    base_job,
    example,
)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    job = parse_rljob(yaml.safe_load(path.read_text()), str(path))
    assert job.spec.roles.actor.replicas >= 1
    assert job.metadata.name


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_spec_is_refused_naming_the_field(case: Case) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_rljob(case.job())
    text = str(info.value)
    for field in case.fields:
        assert field in text, f"{case.id}: expected {field!r} in:\n{text}"


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_edge_of_a_rule_is_accepted(case: Case) -> None:
    parse_rljob(case.job())


@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_immutable_fields_refuse_changes(case: Case) -> None:
    old = parse_rljob(base_job())
    try:
        new = parse_rljob(case.job())
    except InvalidSpec as exc:  # also refused on its own merits; the message still names the field
        text = str(exc)
    else:
        with pytest.raises(InvalidSpec) as info:
            check_rljob_update(old, new)
        text = str(info.value)
    for field in case.fields:
        assert field in text, f"{case.id}: expected {field!r} in:\n{text}"


@pytest.mark.parametrize("case", ROLLOUT_TRANSITIONS, ids=lambda c: c.id)
def test_rollout_replicas_change_in_place_only_where_engines_are_one_process(case: Transition) -> None:
    old, new = (parse_rljob(job) for job in case.jobs())
    if not case.fields:
        check_rljob_update(old, new)
        return
    with pytest.raises(InvalidSpec) as info:
        check_rljob_update(old, new)
    for field in case.fields:
        assert field in str(info.value), f"{case.id}: expected {field!r} in:\n{info.value}"


def test_unchanged_update_is_allowed() -> None:
    old = parse_rljob(base_job())
    job = base_job()
    job["spec"]["trainer"]["totalTrainingSteps"] = 1000  # mutable
    check_rljob_update(old, parse_rljob(job))


def test_defaults_follow_verl() -> None:
    spec = parse_rljob(example("tiny-cpu.yaml")).spec
    assert spec.actor.clip_ratio == 0.2
    assert spec.actor.clip_ratio_c == 3.0
    assert spec.actor.entropy_coeff == 0.0
    assert spec.actor.ppo_epochs == 1
    assert spec.actor.loss_agg_mode == "token-mean"
    assert spec.actor.kl_loss_type == "low_var_kl"
    assert (spec.algorithm.gamma, spec.algorithm.lam) == (1.0, 1.0)
    assert spec.algorithm.kl_ctrl.kl_coef == 0.001
    assert spec.critic.optim.lr == 1e-5


def test_the_critics_learning_rate_default_holds_when_other_optimizer_keys_are_set() -> None:
    # verl's critic learns at 1e-5 and its actor at 1e-6, whatever else of their optimizers is set.
    job = base_job()
    job["spec"]["critic"] = {"optim": {"weightDecay": 0.0}}
    job["spec"].setdefault("actor", {})["optim"] = {"weightDecay": 0.0}
    spec = parse_rljob(job).spec
    assert (spec.critic.optim.lr, spec.critic.optim.weight_decay) == (1e-5, 0.0)
    assert (spec.actor.optim.lr, spec.actor.optim.weight_decay) == (1e-6, 0.0)
    # The trainer's YAML, snake_case, reads the same.
    data = spec.trainer_config().to_config()
    data["critic"] = {"optim": {"weight_decay": 0.0}}
    data["actor"]["optim"] = {"weight_decay": 0.0}
    config = TrainerConfig.model_validate(data)
    assert (config.critic.optim.lr, config.actor.optim.lr) == (1e-5, 1e-6)
    job["spec"]["critic"] = {"optim": {"lr": 3e-6}}
    assert parse_rljob(job).spec.critic.optim.lr == 3e-6


def test_the_critic_as_applied_takes_what_it_leaves_unset_from_the_actor_and_the_model() -> None:
    # verl's critic config interpolates these from actor_rollout_ref; the trainer's critic reads
    # only its own section, so the section as it applies carries them.
    data = parse_rljob(base_job()).spec.trainer_config().to_config()
    data["actor"]["ppo_epochs"] = 3
    data["model"]["use_remove_padding"] = False
    applied = TrainerConfig.model_validate(data).critic_applied
    mini = data["actor"]["ppo_mini_batch_size"]
    assert (applied.model_path, applied.ppo_epochs, applied.ppo_mini_batch_size) == (data["model"]["path"], 3, mini)
    assert applied.use_remove_padding is False
    data["critic"] = {"model_path": "/models/critic", "ppo_epochs": 2, "ppo_mini_batch_size": 2 * mini}
    data["critic"]["use_remove_padding"] = True
    own = TrainerConfig.model_validate(data).critic_applied
    assert (own.model_path, own.ppo_epochs, own.ppo_mini_batch_size) == ("/models/critic", 2, 2 * mini)
    assert own.use_remove_padding is True
    assert own.optim.lr == 1e-5  # the rest of the section is the job's as it was


def test_trainer_config_uses_verl_snake_case_and_names_file_and_key(tmp_path: Path) -> None:
    spec = parse_rljob(example("tiny-cpu.yaml")).spec
    config = spec.trainer_config().to_config()
    assert "adv_estimator" in config["algorithm"]
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config))
    assert load_trainer_config(good).rollout.n == 8

    config["actor"]["clip_ratio_c"] = 0.5
    config["algorithm"]["adv_estimatr"] = "grpo"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(InvalidSpec) as info:
        load_trainer_config(bad)
    text = str(info.value)
    assert str(bad) in text
    assert "actor.clip_ratio_c: Input should be greater than 1" in text
    assert "algorithm.adv_estimatr: Extra inputs are not permitted" in text


def test_optimizer_offload_reaches_the_trainer_config_of_actor_and_critic(tmp_path: Path) -> None:
    job = example("tiny-cpu.yaml")
    job["spec"]["actor"] = {**job["spec"].get("actor", {}), "fsdpConfig": {"optimizerOffload": True}}
    job["spec"]["critic"] = {**job["spec"].get("critic", {}), "fsdpConfig": {"optimizerOffload": True}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(parse_rljob(job).spec.trainer_config().to_config()))
    config = load_trainer_config(path)
    assert config.actor.fsdp_config.optimizer_offload and config.critic.fsdp_config.optimizer_offload
    assert not config.actor.fsdp_config.param_offload
    assert not config.ref.fsdp_config.optimizer_offload


def test_trainer_config_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"missing\.yaml"):
        load_trainer_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed")
    with pytest.raises(InvalidSpec, match=r"broken\.yaml.*\n.*not valid YAML"):
        load_trainer_config(broken)


def test_wire_round_trip_is_stable() -> None:
    job = parse_rljob(base_job())
    again = RLJob.model_validate(job.to_wire())
    assert again == job


def test_no_package_shadows_the_standard_operator_module() -> None:
    assert stdlib_operator.add(2, 3) == 5
    assert not hasattr(stdlib_operator, "__path__"), "something named 'operator' shadows the standard library"


def test_admitted_objects_skip_cel_but_not_types() -> None:
    """The operator parses RLJobs read back from the API server, which enforced the CEL
    rules on write: they are not evaluated again (most of a reconcile pass's CPU), while
    types and bounds still are."""
    cel_violation = Case("fsdp", lambda job: job["spec"]["roles"]["actor"].update(fsdpSize=5), ()).job()
    with pytest.raises(InvalidSpec, match="fsdpSize must divide"):
        parse_rljob(cel_violation)
    assert parse_rljob(cel_violation, admitted=True).spec.roles.actor.fsdp_size == 5
    wrong_type = Case("replicas", lambda job: job["spec"]["roles"]["actor"].update(replicas="two"), ()).job()
    with pytest.raises(InvalidSpec, match=r"spec\.roles\.actor\.replicas"):
        parse_rljob(wrong_type, admitted=True)


def test_rollout_correction_is_token_tis_by_default_only_in_the_asynchronous_modes() -> None:
    sync = parse_rljob(base_job()).spec
    assert sync.rollout_correction.rollout_is is None and not sync.rollout_correction.enabled
    job = base_job()
    job["spec"].setdefault("trainer", {})["v1"] = {"trainerMode": "separate_async"}
    asynchronous = parse_rljob(job).spec
    assert asynchronous.rollout_correction.rollout_is == "token"
    assert asynchronous.rollout_correction.rollout_is_threshold == "2.0"
    assert asynchronous.algorithm.rollout_correction.rollout_is is None  # the spec itself is unchanged
    job["spec"].setdefault("algorithm", {})["rolloutCorrection"] = {"rolloutIs": "sequence"}
    assert parse_rljob(job).spec.rollout_correction.rollout_is == "sequence"  # an explicit choice stands


def test_free_cache_engine_defaults_by_trainer_mode_and_an_explicit_value_is_judged() -> None:
    """Unset, rollout.freeCacheEngine is the mode's default (true; false in colocate_async,
    whose engine generates while the actor trains), in the RLJob and in the trainer's config
    the operator writes from it; an explicit true there is still refused by name."""
    assert parse_rljob(base_job()).spec.rollout.free_cache_engine is True
    job = base_job()
    job["spec"].setdefault("trainer", {})["v1"] = {"trainerMode": "colocate_async"}
    job["spec"]["trainer"]["testFreq"] = -1
    job["spec"].setdefault("roles", {})["rollout"] = {"placement": "colocated"}
    spec = parse_rljob(job).spec
    assert spec.rollout.free_cache_engine is False
    assert spec.to_config()["rollout"]["free_cache_engine"] is False
    job["spec"].setdefault("rollout", {})["freeCacheEngine"] = True
    with pytest.raises(InvalidSpec, match=r"spec\.rollout\.freeCacheEngine.*colocate_async"):
        parse_rljob(job)
