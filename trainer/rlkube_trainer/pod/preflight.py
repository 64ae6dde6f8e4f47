"""Pre-flight: the files a run needs exist and load, and the config fits them, checked
before anyone waits for anyone (the driver before it starts the Ray head, a role pod before
it joins). A failure is a `PreflightError` naming the trainer key, the RLJob field and the
path; the CLI exits with its class (failures.py: `ExitCode.DATA` for a `data.` key, else
`ExitCode.CONFIG`), which the operator treats as permanent.

Checks are cheap on purpose: a model's config (not its weights), a parquet file's schema
(not its rows), the tokenizer, the reward function's import. What only a full load finds
(a prompt longer than maxPromptLength, say) still fails with a named error later, and the
driver exits with the same code for it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlkube_api.config import TrainerConfig
from rlkube_api.exit_codes import TERMINATION_MESSAGE_LIMIT, TERMINATION_MESSAGE_PATH
from rlkube_api.placement import Role, placement_of, used_roles
from rlkube_trainer.cluster.config_errors import PreflightError

log = logging.getLogger("rlkube.trainer")

# Weight files a Hugging Face model directory holds (one of them, or their shards).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")


# --- single checks ---------------------------------------------------------------------------------


def check_model_dir(key: str, path: str, trust_remote_code: bool = False) -> Any:
    """A Hugging Face model directory: config.json that loads, and weights. Returns its config."""
    from transformers import AutoConfig  # noqa: PLC0415  (transformers: only when checking)

    folder = Path(path)
    if not folder.exists():
        raise PreflightError(key, path, "does not exist (is the volume holding it mounted, and the path right?)")
    if not folder.is_dir():
        raise PreflightError(key, path, "is not a directory (a Hugging Face model directory is needed)")
    if not (folder / "config.json").is_file():
        raise PreflightError(key, path, "no config.json there (a Hugging Face model directory is needed)")
    if not any(any(folder.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        raise PreflightError(key, path, "no weights there (*.safetensors or *.bin)")
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many kinds for a bad config
        raise PreflightError(key, path, f"config.json does not load: {type(exc).__name__}: {exc}") from None


def check_tokenizer(key: str, path: str) -> Any:
    """The tokenizer loads from a local directory (never a hub id: the path is checked first,
    or transformers reports a missing directory as a malformed repo id)."""
    from rlkube_trainer.model.loading import load_tokenizer  # noqa: PLC0415

    if not Path(path).is_dir():
        raise PreflightError(key, path, "does not exist or is not a directory")
    try:
        return load_tokenizer(path)
    except Exception as exc:
        raise PreflightError(key, path, f"the tokenizer does not load: {type(exc).__name__}: {exc}") from None


def check_positions(config: TrainerConfig, model_config: Any) -> None:
    """A prompt and its response must fit the model's positions."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return
    data = config.data
    total = data.max_prompt_length + data.max_response_length
    if total > positions:
        raise PreflightError(
            "data.max_prompt_length",
            None,
            f"max_prompt_length {data.max_prompt_length} + max_response_length {data.max_response_length} = "
            f"{total} exceeds the model's max_position_embeddings {positions} ({config.model.path})",
        )


def check_data_file(key: str, path: str, config: TrainerConfig) -> None:
    """Exists, has a known format, and has the configured columns (the schema only)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from rlkube_trainer.data.prompts import (  # noqa: PLC0415
        ARROW_SUFFIXES,
        JSON_LINES_SUFFIXES,
        PARQUET_SUFFIXES,
        DataError,
        DataFile,
        RowKeys,
    )

    file = Path(path)
    suffix = file.suffix.lower()
    known = (*PARQUET_SUFFIXES, *ARROW_SUFFIXES, *JSON_LINES_SUFFIXES)
    if suffix not in known:
        raise PreflightError(key, path, f"unknown extension {file.suffix!r} (expected one of {', '.join(known)})")
    if not file.is_file():
        raise PreflightError(key, path, "does not exist")
    columns: list[str] | None = None
    try:
        if suffix in PARQUET_SUFFIXES:
            columns = list(pq.read_schema(file).names)
        elif suffix in JSON_LINES_SUFFIXES:
            with file.open(encoding="utf-8") as lines:
                first = next((line for line in lines if line.strip()), None)
            if first is None:
                raise PreflightError(key, path, "is empty")
            row = json.loads(first)
            columns = list(row) if isinstance(row, dict) else None
        else:
            file.open("rb").close()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise PreflightError(key, path, f"cannot be read: {exc}") from None
    if columns is None:
        return
    try:
        RowKeys.from_config(config.data, require_ground_truth=config.reward.model is None).check_columns(
            DataFile(path, columns, [])
        )
    except DataError as exc:
        raise PreflightError(key, path, str(exc)) from None


def check_reward_function(config: TrainerConfig) -> None:
    from rlkube_trainer.reward.scoring import RewardFunctionError, load_reward_function  # noqa: PLC0415

    function = config.reward.function
    if function is None or function.path is None:
        return
    try:
        load_reward_function(function.path, function.name)
    except RewardFunctionError as exc:
        raise PreflightError("reward.function.path", function.path, str(exc)) from None


def check_multi_turn(config: TrainerConfig) -> None:
    """The tool and interaction files load (a key missing from the job's ConfigMap, a module that
    does not import, a sandbox section without a code interpreter) before any model is loaded."""
    from rlkube_trainer.rollout.agent.config import load_interaction_config, load_tools  # noqa: PLC0415

    section = config.rollout.multi_turn
    if not section.enable:
        return
    for key in ("tool_config_path", "function_tool_path", "interaction_config_path"):
        path = getattr(section, key)
        if path is not None and not Path(path).is_file():
            raise PreflightError(
                f"rollout.multi_turn.{key}",
                path,
                "is not a file (in an RLJob with multiTurn.configMap: a key the ConfigMap lacks)",
            )
    try:
        load_tools(section)
        load_interaction_config(section)
    except (ValueError, TypeError, OSError) as exc:
        raise PreflightError("rollout.multi_turn", None, str(exc)) from None


def check_harness(config: TrainerConfig) -> None:
    """The harness's program is found (on PATH, or an executable file) before any model loads:
    otherwise every episode of the first batch would be lost to the same error."""
    section = config.rollout.harness
    if section is None:
        return
    program = section.command[0]
    if shutil.which(program) is None:
        raise PreflightError(
            "rollout.harness.command",
            program,
            "is not a program in this container (not on PATH, or not an executable file)",
        )


def check_checkpoint_dir(path: str) -> None:
    """The checkpoint folder can be made and written (a volume that is missing or read-only
    would fail only at the first save, after a whole saveFreq of training)."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rlkube-preflight-"):
            pass
    except OSError as exc:
        raise PreflightError("checkpoint.dir", path, f"not writable: {exc.strerror or exc}") from None


def check_checkpoint_uri(uri: str, endpoint_url: str | None) -> None:
    """The object store can be reached and written with the credentials this process has (a
    wrong key, bucket or endpoint fails now, not at the first save), through a backend this
    image holds."""
    from rlkube_trainer.checkpoint.objectstore import ObjectPath, ObjectStoreError, storage_options  # noqa: PLC0415

    try:
        probe = ObjectPath(uri, storage_options(uri, endpoint_url)) / ".rlkube-preflight"
    except ObjectStoreError as exc:
        raise PreflightError("checkpoint.uri", uri, str(exc)) from None
    try:
        probe.write_bytes(b"")
        probe.unlink(missing_ok=True)
    except Exception as exc:  # the backends raise their own errors (obstore's, per store)
        where = f" at {endpoint_url}" if endpoint_url else ""
        raise PreflightError("checkpoint.uri", uri, f"not writable{where}: {type(exc).__name__}: {exc}") from None


# --- what each process checks ----------------------------------------------------------------------


def model_paths(config: TrainerConfig, roles: Iterable[Role]) -> list[tuple[str, str]]:
    """(key, path) of the model directories the given roles load."""
    wanted = set(roles)
    paths: list[tuple[str, str]] = []
    if wanted & {Role.ACTOR, Role.REFERENCE, Role.ROLLOUT}:
        paths.append(("model.path", config.model.path))
    if Role.CRITIC in wanted and config.critic.model_path:
        paths.append(("critic.model_path", config.critic.model_path))
    elif Role.CRITIC in wanted and not paths:
        paths.append(("model.path", config.model.path))
    if Role.REWARD in wanted and config.reward.model is not None:
        paths.append(("reward.model.path", config.reward.model.path))
    return paths


def check_driver(config: TrainerConfig) -> None:
    """Everything the driver and the run need, in the order a user would fix them."""
    trust = config.model.trust_remote_code
    roles = used_roles(config)
    model_config = None
    for key, path in model_paths(config, roles):
        found = check_model_dir(key, path, trust)
        if key == "model.path":
            model_config = found
    tokenizer_key = "model.tokenizer_path" if config.model.tokenizer_path else "model.path"
    check_tokenizer(tokenizer_key, config.model.tokenizer_path or config.model.path)
    if model_config is not None:
        check_positions(config, model_config)
    for i, path in enumerate(config.data.train_files):
        check_data_file(f"data.train_files[{i}]", path, config)
    for i, path in enumerate(config.data.val_files or []):
        check_data_file(f"data.val_files[{i}]", path, config)
    check_reward_function(config)
    check_multi_turn(config)
    check_harness(config)
    check_checkpoint_dir(config.checkpoint.dir)
    if config.checkpoint.uri is not None:
        check_checkpoint_uri(config.checkpoint.uri, config.checkpoint.endpoint_url)
    check_packages(config)


def check_packages(config: TrainerConfig) -> None:
    """The optional packages the config asks for are in this image (every pod of a job runs
    the same one): refused now, not as an import error in the actor after the gang started."""
    if config.model.use_liger and importlib.util.find_spec("liger_kernel") is None:
        raise PreflightError(
            "model.use_liger", None, "needs the liger-kernel package, which this trainer image does not hold"
        )


def check_group(config: TrainerConfig, group: str) -> None:
    """A role pod: the files the roles its group hosts load, before it joins the driver."""
    placement = placement_of(config)
    hosted = next((g.hosts for g in placement.groups if g.name == group), frozenset())
    for key, path in model_paths(config, hosted):
        check_model_dir(key, path, config.model.trust_remote_code)
    if Role.ROLLOUT in hosted:
        check_tokenizer(
            "model.tokenizer_path" if config.model.tokenizer_path else "model.path",
            config.model.tokenizer_path or config.model.path,
        )


def write_termination_message(message: str, path: str = TERMINATION_MESSAGE_PATH) -> None:
    """Leaves `message` where the kubelet reads a container's termination message, when the
    container has that file (Kubernetes creates it; outside a pod nothing is written)."""
    target = Path(path)
    if not target.is_file():
        return
    # Its end when too long: a traceback ends with the error (and the operator keeps the end).
    data = message.encode()[-TERMINATION_MESSAGE_LIMIT:]
    try:
        target.write_bytes(data)
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", target, exc)
