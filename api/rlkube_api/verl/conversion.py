"""A verl config converted: its keys mapped by the tables (rules.RULES), keys without a rule
ignored where they hold verl's defaults (defaults.DEFAULTS) and refused where they do not, what
depends on several keys settled, the roles placed as verl's hybrid engine places them; and the
same settings as an RLJob."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from rlkube_api.config import TrainerConfig
from rlkube_api.rljob import RLJob
from rlkube_api.validation import InvalidSpec, parse_rljob, parse_trainer_config
from rlkube_api.verl.defaults import DEFAULTS, VERL_VERSION
from rlkube_api.verl.keys import Ignored
from rlkube_api.verl.resolve import MISSING, ComposedConfig, VerlConfigError
from rlkube_api.verl.rules import RULES


@dataclass(frozen=True)
class Conversion:
    config: TrainerConfig
    mapped: list[tuple[str, str]]  # (verl key, rlkube key)
    ignored: list[tuple[str, str]]  # (verl key, why)
    at_default: list[str] = field(default_factory=list)  # keys without a rule, at verl's defaults

    def report(self) -> str:
        lines = [f"mapped {len(self.mapped)} keys:"]
        lines += [f"  {verl} -> {target}" for verl, target in self.mapped]
        lines.append(f"ignored {len(self.ignored)} keys (no counterpart, value has no effect here):")
        lines += [f"  {verl}: {why}" for verl, why in self.ignored]
        lines.append(
            f"ignored {len(self.at_default)} keys at verl {VERL_VERSION}'s defaults "
            "(no counterpart here; another value would be refused):"
        )
        by_section: dict[str, list[str]] = {}
        for key in self.at_default:
            section, _, leaf = key.rpartition(".")
            by_section.setdefault(section, []).append(leaf)
        lines += [f"  {section}: {', '.join(leaves)}" for section, leaves in by_section.items()]
        return "\n".join(lines)


# Keys with defaults below them (a mapping in one of verl's shipped configs).
_BRANCHES = {key.rsplit(".", n)[0] for key in DEFAULTS for n in range(1, key.count(".") + 1)}


def _leaves(node: Mapping[str, Any], written: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, resolved value) of every leaf; a mapping that has a rule of its own is one
    leaf (its rule judges it whole), as are an empty mapping, a mapping an interpolation wrote,
    and a mapping where verl's default is not one (an interpolation, null, {})."""
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        below = written.get(k) if isinstance(written, Mapping) else None
        branch = key not in DEFAULTS or key in _BRANCHES
        if isinstance(v, Mapping) and v and isinstance(below, Mapping) and key not in RULES and branch:
            out += _leaves(v, below, key)
        else:
            out.append((key, v))
    return out


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _written(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _default_of(key: str, value: Any, composed: ComposedConfig) -> str | None:
    """Why `key` (no rule of its own) is refused, or None where it holds verl's default: the
    value verl ships as written (an interpolation is verl's wiring, whatever it resolves to
    here), or a value that resolves to what verl's would resolve to in this config."""
    defaults = DEFAULTS.get(key)
    if defaults is None:
        return f"{key}: unknown verl key (no rlkube counterpart known)"
    if _written(composed.written, key) in defaults or value in defaults:
        return None
    if any(isinstance(d, str) and "${" in d and composed.evaluate(key, d) == value for d in defaults):
        return None
    return f"{key}: {value!r} is not verl {VERL_VERSION}'s default ({_shown(defaults)}), and rlkube has no counterpart"


def _shown(defaults: tuple[Any, ...]) -> str:
    return " or ".join(repr(d) for d in defaults)


def convert(verl: Mapping[str, Any], source: str = "config") -> Conversion:
    """The trainer config a verl config describes, and what was mapped and ignored."""
    try:
        composed = ComposedConfig(verl)
        resolved = composed.resolved()
    except VerlConfigError as error:
        raise VerlConfigError(source, error.errors) from None
    tree: dict[str, Any] = {}
    mapped: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []
    at_default: list[str] = []
    errors: list[str] = []
    for key, value in _leaves(resolved, composed.written):
        rule = RULES.get(key)
        if rule is None:
            refusal = _default_of(key, value, composed)
            if refusal is None:
                at_default.append(key)
            else:
                errors.append(refusal)
            continue
        if value == MISSING:
            errors.append(f"{key}: ??? (verl requires a value: set it)")
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
    if "critic" not in tree["roles"] and tree.pop("critic", None) is not None:
        # verl's critic section is read only when a critic runs; its model path (a placeholder
        # in verl's yaml) would otherwise have to name a real model.
        _unmap("critic.", "no critic runs: algorithm.adv_estimator is not gae", mapped, ignored)
    try:
        config = parse_trainer_config(tree, source)
    except InvalidSpec as invalid:
        raise VerlConfigError(source, [f"after mapping, {e}" for e in invalid.errors]) from None
    return Conversion(config, mapped, ignored, at_default)


def _finish(
    tree: dict[str, Any], verl: Mapping[str, Any], mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]
) -> list[str]:
    """What depends on more than one key: which reward source verl would use, resume paths."""
    errors: list[str] = []
    reward = tree.setdefault("reward", {})
    enabled = _reward_sources(reward, verl)
    if not reward.get("function", {}).get("path") and reward.pop("function", None) is not None:
        # A name without a path (verl's default name) selects nothing: with neither a function
        # nor a model, verl and rlkube score each row with the built-in scorer of its data_source.
        _unmap("reward.function.", "no reward function path: the built-in scorers by data_source", mapped, ignored)
    unused = "function" if enabled else "model"
    if reward.pop(unused, None) is not None:
        why = "reward_model.enable wins" if unused == "function" else "reward_model.enable is false"
        _unmap(f"reward.{unused}.", why, mapped, ignored)
    if enabled and reward.pop("num_workers", None) is not None:
        _unmap("reward.num_workers", "a reward model scores on its ranks, not in worker processes", mapped, ignored)
    trainer = verl.get("trainer") or {}
    if trainer.get("resume_mode") == "resume_path" and trainer.get("resume_from_path"):
        # resume auto + resumeFrom: the path seeds the run, and a restart after this run's own
        # first checkpoint resumes from that one, not from the seed again.
        _set(tree, "checkpoint.resume_from", trainer["resume_from_path"])
        mapped.append(("trainer.resume_from_path", "checkpoint.resume_from"))
    errors += _async_save(tree, verl, mapped, ignored)
    return errors


def _unmap(target: str, why: str, mapped: list[tuple[str, str]], ignored: list[tuple[str, str]]) -> None:
    """The keys mapped under `target` (a prefix of rlkube keys) are ignored after all, for `why`."""
    dropped = [(k, t) for k, t in mapped if t.startswith(target)]
    mapped[:] = [m for m in mapped if m not in dropped]
    ignored += [(k, why) for k, _ in dropped]


def _reward_sources(reward: dict[str, Any], verl: Mapping[str, Any]) -> bool:
    """verl 0.9.1's reading of its two reward layouts: a legacy custom_reward_function with any
    key set replaces reward.custom_reward_function whole, and each legacy reward_model key set
    wins over reward.reward_model's. Whether a reward model is enabled."""
    legacy_function = verl.get("custom_reward_function") or {}
    if any(v is not None for v in legacy_function.values()):
        reward["function"] = {k: v for k in ("path", "name") if (v := legacy_function.get(k)) is not None}
    legacy_model = verl.get("reward_model") or {}
    if (workers := legacy_model.get("num_workers")) is not None:
        reward["num_workers"] = workers
    path = (legacy_model.get("model") or {}).get("path")
    if path is not None:
        reward.setdefault("model", {})["path"] = path
    enabled = legacy_model.get("enable")
    if enabled is None:
        enabled = ((verl.get("reward") or {}).get("reward_model") or {}).get("enable")
    return bool(enabled)


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
