"""A verl config converted: its keys mapped by the tables (rules.RULES), what depends on several
keys settled, the roles placed as verl's hybrid engine places them; and the same settings as an
RLJob."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from rlkube_api.config import TrainerConfig
from rlkube_api.rljob import RLJob
from rlkube_api.validation import InvalidSpec, parse_rljob, parse_trainer_config
from rlkube_api.verl.keys import Ignored
from rlkube_api.verl.resolve import VerlConfigError, resolve
from rlkube_api.verl.rules import RULES


@dataclass(frozen=True)
class Conversion:
    config: TrainerConfig
    mapped: list[tuple[str, str]]  # (verl key, rlkube key)
    ignored: list[tuple[str, str]]  # (verl key, why)

    def report(self) -> str:
        lines = [f"mapped {len(self.mapped)} keys:"]
        lines += [f"  {verl} -> {target}" for verl, target in self.mapped]
        lines.append(f"ignored {len(self.ignored)} keys (no counterpart, value has no effect here):")
        lines += [f"  {verl}: {why}" for verl, why in self.ignored]
        return "\n".join(lines)


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf; a mapping that has a rule of its own is one leaf
    (its rule judges it whole), as is an empty mapping."""
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v and key not in RULES:
            out += _leaves(v, key)
        else:
            out.append((key, v))
    return out


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def convert(verl: Mapping[str, Any], source: str = "config") -> Conversion:
    """The trainer config a verl config describes, and what was mapped and ignored."""
    try:
        resolved = resolve(verl)
    except VerlConfigError as error:
        raise VerlConfigError(source, error.errors) from None
    tree: dict[str, Any] = {}
    mapped: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []
    errors: list[str] = []
    for key, value in _leaves(resolved):
        rule = RULES.get(key)
        if rule is None:
            errors.append(f"{key}: unknown verl key (no rlkube counterpart known)")
            continue
        if isinstance(rule, Ignored):
            if not rule.accepts(value):
                errors.append(f"{key}: {rule.refusal} (got {value!r})")
            else:
                ignored.append((key, rule.why))
            continue
        try:
            converted = rule.convert(value) if rule.convert and value is not None else value
        except ValueError as error:
            errors.append(f"{key}: {error} (got {value!r})")
            continue
        if converted is None:
            ignored.append((key, "null: rlkube's default"))
            continue
        _set(tree, rule.target, converted)
        mapped.append((key, rule.target))
    errors += _finish(tree, resolved, mapped, ignored)
    if errors:
        raise VerlConfigError(source, errors)
    _place_roles(tree)
    try:
        config = parse_trainer_config(tree, source)
    except InvalidSpec as invalid:
        raise VerlConfigError(source, [f"after mapping, {e}" for e in invalid.errors]) from None
    return Conversion(config, mapped, ignored)


def _finish(
    tree: dict[str, Any], verl: Mapping[str, Any], mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]
) -> list[str]:
    """What depends on more than one key: which reward source verl would use, resume paths."""
    errors: list[str] = []
    reward = tree.setdefault("reward", {})
    if not reward.get("function", {}).get("path"):
        reward.pop("function", None)  # a name without a path (verl's default name) selects nothing
    unused = "function" if (verl.get("reward_model") or {}).get("enable") else "model"
    if reward.pop(unused, None) is not None:
        dropped = [(k, t) for k, t in mapped if t.startswith(f"reward.{unused}.")]
        mapped[:] = [m for m in mapped if m not in dropped]
        why = "reward_model.enable wins" if unused == "function" else "reward_model.enable is false"
        ignored += [(k, why) for k, _ in dropped]
    trainer = verl.get("trainer") or {}
    if trainer.get("resume_mode") == "resume_path" and trainer.get("resume_from_path"):
        # resume auto + resumeFrom: the path seeds the run, and a restart after this run's own
        # first checkpoint resumes from that one, not from the seed again.
        _set(tree, "checkpoint.resume_from", trainer["resume_from_path"])
        mapped.append(("trainer.resume_from_path", "checkpoint.resume_from"))
    errors += _async_save(tree, verl, mapped, ignored)
    if not reward:
        errors.append(
            "custom_reward_function.path: required (verl's built-in scorers by data_source have no counterpart)"
        )
    return errors


def _async_save(
    tree: dict[str, Any], verl: Mapping[str, Any], mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]
) -> list[str]:
    """actor.checkpoint.async_save becomes checkpoint.async_save (the rest of the section is
    ignored by its rule). One rlkube checkpoint holds every role, so the actor's key decides
    for all, as it decides verl's latest marker; a critic asking for it alone is refused."""
    actor = ((verl.get("actor_rollout_ref") or {}).get("actor") or {}).get("checkpoint") or {}
    critic = (verl.get("critic") or {}).get("checkpoint") or {}
    key = "actor_rollout_ref.actor.checkpoint.async_save"
    if actor.get("async_save") is not None:
        _set(tree, "checkpoint.async_save", bool(actor["async_save"]))
        mapped.append((key, "checkpoint.async_save"))
    if critic.get("async_save") and not actor.get("async_save"):
        return [
            "critic.checkpoint.async_save: one rlkube checkpoint holds every role, and "
            f"{key} decides for all: set it there (got critic true, actor false)"
        ]
    if critic.get("async_save") is not None:
        ignored.append(("critic.checkpoint.async_save", f"{key} decides for every role"))
    return []


def _place_roles(tree: dict[str, Any]) -> None:
    """verl's hybrid engine: every role in one pool of nnodes × n_gpus_per_node, so the
    reference, critic and reward model run inside the actor's workers, and so does rollout."""
    roles = tree.setdefault("roles", {})
    actor = roles.setdefault("actor", {})
    actor.setdefault("replicas", 1)
    actor.setdefault("gpus_per_replica", 8)
    algorithm = tree.setdefault("algorithm", {})
    algorithm.setdefault("adv_estimator", "gae")  # verl's default; rlkube's is grpo
    if algorithm.get("use_kl_in_reward") or tree.get("actor", {}).get("use_kl_loss"):
        roles["reference"] = {"colocate_with": "actor"}
    if algorithm["adv_estimator"] == "gae":
        roles["critic"] = {"colocate_with": "actor"}
    if "model" in tree["reward"]:
        roles["reward"] = {"colocate_with": "actor"}


# Where a converted RLJob mounts its checkpoint claim: verl's relative default_local_dir goes under it.
CHECKPOINT_MOUNT = "/checkpoints"


def checkpoint_claim_of(name: str) -> str:
    """The PersistentVolumeClaim a converted RLJob named `name` keeps its checkpoints on, unless told."""
    return f"{name}-checkpoints"


def to_rljob(config: TrainerConfig, name: str, image: str, checkpoint_claim: str | None = None) -> RLJob:
    """The same settings as an RLJob (camelCase, the Kubernetes fields added). Checkpoints
    without an object store go on a claim every pod mounts (`checkpoint_claim`, by default
    `checkpoint_claim_of(name)`): the driver and every actor rank write parts of each one,
    and verl's default_local_dir, a path on one machine, would be each pod's own."""
    spec = {**config.to_wire(), "image": image}
    if config.checkpoint.uri is None:
        local = PurePosixPath(config.checkpoint.dir)
        directory = local if local.is_absolute() else PurePosixPath(CHECKPOINT_MOUNT) / local
        claim = checkpoint_claim or checkpoint_claim_of(name)
        spec["checkpoint"] = {
            **spec["checkpoint"],
            "dir": str(directory),
            "volume": {"persistentVolumeClaim": {"claimName": claim}},
        }
    return parse_rljob({"metadata": {"name": name}, "spec": spec}, f"RLJob {name}")
