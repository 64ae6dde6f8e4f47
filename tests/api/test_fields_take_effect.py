"""Every accepted spec field takes effect. For each leaf field of
RLJobSpec (walked from the pydantic model, the CRD's source), a non-default value is
set on the GPU example; the field passes if the operator's children (StatefulSets,
Services, the trainer ConfigMap, ...) change, or if validation refuses the value with
an error naming the field. A field that does neither fails the test by name. Any trainer field
changes the trainer ConfigMap, so for those this walk only shows the value reaches the trainer;
tests/trainer/test_trainer_fields_take_effect.py shows each one changes the settings the
trainer runs with (its effective settings at start).

KNOWN_IGNORED lists what this check found ignored on 2026-12-02 and is not fixed yet;
the test also fails when one of them starts to take effect (the list is stale)."""

from __future__ import annotations

import copy
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import pydantic
import pydantic_core
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlkube_api.rljob import RLJob, RLJobSpec
from rlkube_api.validation import parse_rljob, parse_trainer_config
from rlkube_operator.desired import desired_children
from tests.operator.helpers import GPU, RAY_TOKEN, UID, example

# Fields whose effect is outside the pure builders, with the place that reads them.
ELSEWHERE: dict[str, str] = {
    "suspend": "desired_children(pods_wanted=...) in reconcile.py",
    "runPolicy.backoffLimit": "failure_policy.py",
    "runPolicy.activeDeadlineSeconds": "job_state.py / reconcile.py",
    "runPolicy.ttlSecondsAfterFinished": "reconcile.py",
    "runPolicy.pendingTimeoutSeconds": "job_state.py",
}

# Found ignored by this test; each is a bug to fix, not an allowance.
KNOWN_IGNORED: set[str] = set()

_NO_VALUE = object()


def _unwrap(annotation: Any) -> Any:
    """Strips Optional and Annotated."""
    while True:
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _bounds(info: FieldInfo) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in info.metadata:
        lo = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else lo
        lo = getattr(m, "gt", None) if getattr(m, "gt", None) is not None else lo
        hi = getattr(m, "le", None) if getattr(m, "le", None) is not None else hi
        hi = getattr(m, "lt", None) if getattr(m, "lt", None) is not None else hi
    return lo, hi


def _other_value(info: FieldInfo, current: Any) -> Any:
    """A value different from `current`, inside the field's bounds; _NO_VALUE when the
    type has no generic choice (lists, dicts: covered by their own tests)."""
    ann = _unwrap(info.annotation)
    if ann is bool:
        return not bool(current)
    if ann is int:
        lo, hi = _bounds(info)
        start = int(current) if isinstance(current, int) else int(lo or 1)
        return start + 1 if hi is None or start + 1 <= hi else start - 1
    if ann is float:
        lo, hi = _bounds(info)
        base = float(current) if isinstance(current, int | float) else float(lo or 0.5)
        value = base * 0.5 if base else 0.25
        value = value if lo is None or value > lo else (base + (hi if hi is not None else base + 1)) / 2
        # Bounds that admit only the current value (a setting fixed until more is supported):
        # step outside them, which validation must refuse by the field's name.
        return value if value != base else base + 1
    if get_origin(ann) is Literal:
        choices = [c for c in get_args(ann) if c != current]
        return choices[0] if choices else _NO_VALUE
    if ann is str:
        return f"{current}x" if isinstance(current, str) and current else "x"
    return _NO_VALUE


def _leaves(model: type[BaseModel], wire: dict[str, Any], prefix: str) -> list[tuple[str, FieldInfo, Any]]:
    """(dotted wire path, field, current value) of every scalar field reachable from the
    example's wire dict; nested models are walked where the example sets them."""
    out: list[tuple[str, FieldInfo, Any]] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        path = f"{prefix}{alias}"
        ann = _unwrap(info.annotation)
        current = wire.get(alias, _NO_VALUE)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            # An optional sub-object the example leaves unset needs a context of its
            # own (e.g. a critic needs gae) to be valid: not walked here (see NOT_WALKED).
            if isinstance(current, dict) or info.default_factory is not None:
                out += _leaves(ann, current if isinstance(current, dict) else {}, path + ".")
            continue
        if current is _NO_VALUE:
            current = None if info.default is pydantic_core.PydanticUndefined else info.default
        out.append((path, info, current))
    return out


def _children(job: RLJob) -> list[dict[str, Any]]:
    return desired_children(job, UID, 0, True, RAY_TOKEN)


def _set(wire: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = wire
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def _verdict(base_obj: dict[str, Any], base_children: list[dict[str, Any]], path: str, value: Any) -> str | None:
    """None when the field takes effect or is refused by name; otherwise why not."""
    obj = copy.deepcopy(base_obj)
    _set(obj["spec"], path, value)
    try:
        job = parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        leaf = path.rsplit(".", maxsplit=1)[-1]
        return None if leaf in str(exc) else f"refused without naming it: {str(exc)[:200]}"
    try:
        children = _children(job)
    except Exception as exc:  # a builder crash on a valid spec is a finding too
        return f"builders raised {type(exc).__name__}: {exc}"
    return None if children != base_children else f"set to {value!r}: no child or trainer config changed"


def test_every_spec_field_takes_effect_or_is_refused_by_name() -> None:
    base_obj = example(GPU)
    base_children = _children(parse_rljob(copy.deepcopy(base_obj)))
    ignored: dict[str, str] = {}
    # The values as validated: a default that depends on other fields (the trainer mode's) is
    # filled in there, and the other value is the one that differs from it.
    effective = parse_rljob(copy.deepcopy(base_obj)).spec.to_wire()
    for path, info, current in _leaves(RLJobSpec, effective, ""):
        if path in ELSEWHERE:
            continue
        value = _other_value(info, current)
        if value is _NO_VALUE:
            continue
        why = _verdict(base_obj, base_children, path, value)
        if why is not None:
            ignored[path] = why
    new = {p: w for p, w in ignored.items() if p not in KNOWN_IGNORED}
    assert not new, "accepted but ignored:\n" + "\n".join(f"  {p}: {w}" for p, w in sorted(new.items()))
    stale = KNOWN_IGNORED - set(ignored)
    assert not stale, f"KNOWN_IGNORED lists fields that now take effect, remove them: {sorted(stale)}"


def test_the_allow_list_names_real_fields() -> None:
    paths = {p for p, _, _ in _leaves(RLJobSpec, example(GPU)["spec"], "")}
    assert set(ELSEWHERE) <= paths, sorted(set(ELSEWHERE) - paths)


def _refused(path: str, value: Any, names: str) -> None:
    obj = example(GPU)
    _set(obj["spec"], path, value)
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert names in str(exc), str(exc)
        return
    raise AssertionError(f"{path}={value!r} was accepted")


def test_colocated_roles_refuse_their_own_sizes_by_name() -> None:
    _refused("roles.reference.replicas", 2, "replicas")
    _refused("roles.reference.resources", {"cpu": "4"}, "resources")
    _refused("roles.reference.fsdpSize", 2, "fsdpSize")


def test_reward_fsdp_size_is_refused_by_name() -> None:
    obj = example(GPU)
    obj["spec"]["roles"]["reward"] = {"replicas": 1, "gpusPerReplica": 1, "fsdpSize": 1}
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "roles.reward.fsdpSize" in str(exc), str(exc)
        return
    raise AssertionError("roles.reward.fsdpSize was accepted")


def test_test_freq_without_val_files_is_refused_by_name() -> None:
    obj = example(GPU)
    obj["spec"]["data"].pop("valFiles", None)
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "testFreq" in str(exc), str(exc)
        return
    raise AssertionError("testFreq without valFiles was accepted")


def test_resume_from_is_refused_by_name_where_it_would_never_be_read() -> None:
    _refused("checkpoint.resumeFrom", "checkpoints/step_000010", "resumeFrom")
    obj = example(GPU)
    obj["spec"]["checkpoint"].update({"resume": "disable", "resumeFrom": "/ckpt/other"})
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "resumeFrom" in str(exc), str(exc)
        return
    raise AssertionError("resumeFrom with resume: disable was accepted")


def test_lora_module_lists_take_effect_and_a_regular_expression_is_refused_by_name() -> None:
    """The generic walk skips lists: LoRA's module lists are checked here."""
    base_obj = example(GPU)
    base_children = _children(parse_rljob(copy.deepcopy(base_obj)))
    for path in ("model.targetModules", "model.excludeModules", "critic.targetModules", "critic.excludeModules"):
        assert _verdict(base_obj, base_children, path, ["q_proj", "v_proj"]) is None, path
    _refused("model.targetModules", ".*_proj", "targetModules")


def test_lora_with_a_reference_of_its_own_is_refused_by_name() -> None:
    obj = example(GPU)
    obj["spec"]["actor"]["useKlLoss"] = True
    obj["spec"]["roles"]["reference"] = {"replicas": 1, "gpusPerReplica": 1}
    parse_rljob(copy.deepcopy(obj))  # accepted without LoRA
    _set(obj["spec"], "model.loraRank", 8)
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "loraRank" in str(exc), str(exc)
        return
    raise AssertionError("model.loraRank with roles.reference pods was accepted")


def test_object_store_fields_are_refused_by_name_where_they_cannot_work() -> None:
    _refused("checkpoint.uri", "/ckpt/run", "uri")  # a path belongs in dir
    _refused("checkpoint.uri", "ftp://bucket/run", "uri")
    _refused("checkpoint.endpointUrl", "http://127.0.0.1:9000", "endpointUrl")  # without a uri
    obj = example(GPU)
    obj["spec"]["checkpoint"].update({"uri": "gs://bucket/run", "endpointUrl": "http://127.0.0.1:9000"})
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "endpointUrl" in str(exc), str(exc)
    else:
        raise AssertionError("endpointUrl with a gs:// uri was accepted")
    _refused("checkpoint.credentialsSecret", "ckpt-s3", "credentialsSecret")  # without a uri
    _refused("checkpoint.resume", "bucket/run/step_000010", "resume")
    obj = example(GPU)
    obj["spec"]["checkpoint"].update(
        {"uri": "s3://bucket/run", "resumeFrom": "s3://bucket/other/step_000010", "credentialsSecret": "ckpt-s3"}
    )
    parse_rljob(obj)  # a URL seeds a run as a path does


def test_partial_rollout_reaches_the_trainer_or_is_refused_by_name() -> None:
    """asyncTraining.partialRollout: the trainer's config of an asynchronous RLJob carries it
    (what it does: tests/trainer/test_partial_rollout.py, through Ray in test_async_learning.py);
    where a push cannot reach a generation in flight it is refused by name."""
    assert "asyncTraining.partialRollout" in {p for p, _, _ in _leaves(RLJobSpec, example(GPU)["spec"], "")}
    _refused("asyncTraining.partialRollout", True, "partialRollout")  # the example is sync
    colocated = {"rollout.freeCacheEngine": False, "roles.rollout": {"placement": "colocated"}}
    for mode, extra in (("separate_async", {}), ("colocate_async", colocated)):
        obj = example(GPU)
        for path, value in {"trainer.v1.trainerMode": mode, "trainer.testFreq": -1, **extra}.items():
            _set(obj["spec"], path, value)
        assert (
            not parse_rljob(copy.deepcopy(obj)).spec.trainer_config().to_config()["async_training"]["partial_rollout"]
        )
        _set(obj["spec"], "asyncTraining.partialRollout", True)
        config = parse_rljob(copy.deepcopy(obj)).spec.trainer_config().to_config()
        assert parse_trainer_config(config).async_training.partial_rollout, mode
        if mode == "colocate_async":
            _set(obj["spec"], "roles.rollout.tensorParallelSize", 2)
            with pytest.raises((pydantic.ValidationError, ValueError), match=r"asyncTraining\.partialRollout"):
                parse_rljob(obj)


def test_multi_turn_config_map_and_sandbox_take_effect_or_are_refused_by_name() -> None:
    """The generic walk skips optional sub-objects the example leaves unset: multiTurn's
    configMap (a volume in the pods, the trainer's paths) and sandbox (the trainer's limits)."""
    base_obj = example(GPU)
    _set(base_obj["spec"], "roles.rollout", {"placement": "colocated"})
    multi_turn = {
        "enable": True,
        "configMap": {"name": "agent-tools"},
        "toolConfigPath": "tools.yaml",
        "sandbox": {"cpuSeconds": 2},
    }
    _set(base_obj["spec"], "rollout.multiTurn", multi_turn)
    base_children = _children(parse_rljob(copy.deepcopy(base_obj)))
    changes = {
        "rollout.multiTurn.configMap.name": "other-tools",
        "rollout.multiTurn.toolConfigPath": "other.yaml",
        "rollout.multiTurn.sandbox.cpuSeconds": 3,
        "rollout.multiTurn.sandbox.wallSeconds": 4.5,
        "rollout.multiTurn.sandbox.memoryBytes": 2**28,
        "rollout.multiTurn.sandbox.maxProcesses": 4,
        "rollout.multiTurn.sandbox.maxOutputBytes": 100,
        "rollout.multiTurn.sandbox.maxFileBytes": 0,
        # Refused by name: a path where a ConfigMap key belongs.
        "rollout.multiTurn.interactionConfigPath": "/etc/interaction.yaml",
    }
    for path, value in changes.items():
        assert _verdict(base_obj, base_children, path, value) is None, path
    # Refused by name: a bound.
    assert _verdict(base_obj, base_children, "rollout.multiTurn.sandbox.cpuSeconds", 0) is None
    # Separate rollout pods get the ConfigMap too (the episodes run in the driver; every pod
    # mounts it alike).
    obj = copy.deepcopy(base_obj)
    _set(obj["spec"], "roles.rollout", example(GPU)["spec"]["roles"]["rollout"])
    rollout = [
        c
        for c in _children(parse_rljob(obj))
        if c["kind"] == "StatefulSet" and c["metadata"]["name"].endswith("-rollout")
    ]
    volumes = rollout[0]["spec"]["template"]["spec"]["volumes"]
    assert any((v.get("configMap") or {}).get("name") == "agent-tools" for v in volumes), volumes
    _refused("rollout.multiTurn", {"sandbox": {"cpuSeconds": 2}}, "sandbox")  # while disabled


def test_compile_and_recompute_settings_take_effect_and_lora_refuses_another_reference_compile() -> None:
    """The actor update's speed settings: every value reaches the trainer config (the walk above tries one
    value per field; recomputeLogits has three, ref.compileDecoderLayers false differs from unset);
    with LoRA the reference is the actor's model, so only the actor's value is accepted for it."""
    base_obj = example(GPU)
    base_children = _children(parse_rljob(copy.deepcopy(base_obj)))
    for path, value in [
        ("actor.compileDecoderLayers", True),
        ("critic.compileDecoderLayers", True),
        ("ref.compileDecoderLayers", True),
        ("ref.compileDecoderLayers", False),
        ("actor.recomputeLogits", "always"),
        ("actor.recomputeLogits", "never"),
    ]:
        assert _verdict(base_obj, base_children, path, value) is None, (path, value)
    obj = example(GPU)
    _set(obj["spec"], "model.loraRank", 8)
    _set(obj["spec"], "actor.compileDecoderLayers", True)
    _set(obj["spec"], "ref.compileDecoderLayers", True)
    parse_rljob(copy.deepcopy(obj))  # the actor's value: accepted
    _set(obj["spec"], "ref.compileDecoderLayers", False)
    try:
        parse_rljob(obj)
    except (pydantic.ValidationError, ValueError) as exc:
        assert "ref.compileDecoderLayers" in str(exc), str(exc)
        return
    raise AssertionError("ref.compileDecoderLayers unlike the actor's with LoRA was accepted")


def test_runtime_ref_kind_and_name_pick_the_template_the_children_get() -> None:
    """spec.runtimeRef is left out of the walk above (the example names no runtime): here each of
    its fields changes which runtime's template the builders receive. The template's own fields
    are the RLJob's (tests/api/test_runtime.py shows each takes effect as the job's would)."""
    from rlkube_operator.runtimes import resolve_job  # noqa: PLC0415

    def runtime(kind: str, name: str, image: str) -> dict[str, Any]:
        return {"kind": kind, "metadata": {"name": name}, "spec": {"template": {"image": image}}}

    runtimes = {
        ("ClusterRLJobRuntime", "a"): runtime("ClusterRLJobRuntime", "a", "cluster-a:1"),
        ("ClusterRLJobRuntime", "b"): runtime("ClusterRLJobRuntime", "b", "cluster-b:1"),
        ("RLJobRuntime", "a"): runtime("RLJobRuntime", "a", "namespaced-a:1"),
    }

    def images(kind: str, name: str) -> set[str]:
        obj = example(GPU)
        obj["metadata"] = {"name": "job", "namespace": "ml", "generation": 1}
        del obj["spec"]["image"]
        obj["spec"]["runtimeRef"] = {"kind": kind, "name": name}
        job = resolve_job(obj, lambda k, _namespace, n: runtimes.get((k, n)))
        assert isinstance(job, RLJob), job
        sets = [c for c in _children(job) if c["kind"] == "StatefulSet"]
        return {c["spec"]["template"]["spec"]["containers"][0]["image"] for c in sets}

    assert images("ClusterRLJobRuntime", "a") == {"cluster-a:1"}
    assert images("ClusterRLJobRuntime", "b") == {"cluster-b:1"}  # name
    assert images("RLJobRuntime", "a") == {"namespaced-a:1"}  # kind


def test_harness_fields_take_effect_or_are_refused_by_name() -> None:
    """rollout.harness, unset in the example (the walk skips it): each field reaches the trainer's
    config (tests/trainer/test_trainer_fields_take_effect.py: each changes the run), a bad value
    is refused by name, and so is each combination a harness cannot run with."""
    base_obj = example(GPU)
    _set(base_obj["spec"], "rollout.harness", {"command": ["python", "/app/agent.py"]})
    base_children = _children(parse_rljob(copy.deepcopy(base_obj)))
    for path, value in [
        ("rollout.harness.command", ["python", "/app/other.py"]),
        ("rollout.harness.timeoutSeconds", 30.0),
        ("rollout.harness.requireReward", False),
        ("rollout.harness.maxConcurrentEpisodes", 4),
        # Refused by name: bounds.
        ("rollout.harness.command", []),
        ("rollout.harness.timeoutSeconds", 0),
        ("rollout.harness.maxConcurrentEpisodes", 0),
    ]:
        assert _verdict(base_obj, base_children, path, value) is None, path
    config = parse_rljob(copy.deepcopy(base_obj)).spec.trainer_config().to_config()
    assert parse_trainer_config(config).rollout.harness is not None
    one_step_off = {"trainer.v1.trainerMode": "separate_async", "trainer.testFreq": -1}
    for changes, named in [
        ({"rollout.multiTurn": {"enable": True, "toolConfigPath": "/etc/tools.yaml"}}, "rollout.harness"),
        ({"algorithm.advEstimator": "remax"}, "algorithm.advEstimator"),
        (
            {**one_step_off, "asyncTraining.partialRollout": True},
            "partialRollout is not supported with rollout.harness",
        ),
    ]:
        obj = copy.deepcopy(base_obj)
        for path, value in changes.items():
            _set(obj["spec"], path, value)
        with pytest.raises((pydantic.ValidationError, ValueError), match=named.replace(".", r"\.")):
            parse_rljob(obj)
    obj = copy.deepcopy(base_obj)
    _set(obj["spec"], "rollout.harness.requireReward", False)
    obj["spec"].get("reward", {}).pop("function", None)
    with pytest.raises((pydantic.ValidationError, ValueError), match=r"rollout\.harness\.requireReward"):
        parse_rljob(obj)
