"""Checkpoint state I/O: torch objects written atomically, sharded (FSDP2) state through
torch.distributed.checkpoint, and the process RNG states. Which rank writes which file is
the rank's business (rlkube_trainer.workers.rank); the folder protocol is manager.py's."""

from __future__ import annotations

import logging
import random
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from rlkube_trainer.checkpoint.durable import atomic_file
from rlkube_trainer.checkpoint.folder import CheckpointError
from rlkube_trainer.checkpoint.integrity import Written, check_checksum, written
from rlkube_trainer.checkpoint.objectstore import CheckpointPath, ObjectPath, relative
from rlkube_trainer.checkpoint.volume import writing_to


class Checkpointable(Protocol):
    """What a checkpoint needs of a role with an optimizer (workers/training.py's `Trainable`):
    its state whole, or as this rank's shards plus what every rank keeps for itself."""

    @property
    def sharded(self) -> bool: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def sharded_state_dict(self) -> dict[str, Any]: ...
    def load_sharded_state_dict(self, state: dict[str, Any]) -> None: ...
    def load_full_state_dict(self, state: dict[str, Any]) -> None: ...
    def local_state_dict(self) -> dict[str, Any]: ...
    def load_local_state_dict(self, state: dict[str, Any]) -> None: ...


log = logging.getLogger(__name__)


def save_torch(path: CheckpointPath, obj: Any) -> None:
    """torch.save `obj` to `path` atomically and durably (tmp file, fsync, os.replace).

    Keep `obj` to what `load_torch` reads back with weights_only=True: tensors (full or local,
    not DTensors), dicts, lists, tuples, str, int, float, bool and None. State dicts of models,
    optimizers, LR schedulers and data loaders, torch.Generator states and `capture_rng()` are.
    """
    path = path if isinstance(path, ObjectPath) else Path(path)
    # Out of space mid-write: torch raises a RuntimeError whose context is the OSError; the
    # temporary file is removed (atomic_file) and the error names the volume and the file.
    with writing_to(path):
        path.parent.mkdir(parents=True, exist_ok=True)  # exist_ok: ranks create their role dir concurrently
        with atomic_file(path) as f:
            torch.save(obj, f)


def save_sharded(directory: CheckpointPath, state: dict[str, Any]) -> None:
    """A sharded (FSDP2) state dict with torch.distributed.checkpoint: every rank of the default
    group writes its own shards into `directory`, rank 0 the metadata. A collective. In an
    object store each rank uploads its shards itself (torch's fsspec writer)."""
    from torch.distributed.checkpoint.state_dict_saver import save  # noqa: PLC0415  (sharded roles only)

    if isinstance(directory, ObjectPath):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # noqa: PLC0415

        save(state, storage_writer=FsspecWriter(str(directory), **directory.options))
        return
    with writing_to(directory):
        save(state, checkpoint_id=str(directory))


def load_sharded(directory: CheckpointPath, state: dict[str, Any]) -> None:
    """Fills `state` (already holding this rank's shards, e.g. from get_state_dict) in place
    from `directory`, resharding if needed. A collective."""
    from torch.distributed.checkpoint.state_dict_loader import load  # noqa: PLC0415

    if not (directory / ".metadata").is_file():
        raise CheckpointError(f"{directory} holds no sharded checkpoint (no .metadata)")
    with warnings.catch_warnings():
        # One rank without a process group (CPU) reads the shards into a whole model: meant.
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        if isinstance(directory, ObjectPath):
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # noqa: PLC0415

            load(state, storage_reader=FsspecReader(str(directory), **directory.options))
            return
        load(state, checkpoint_id=str(directory))


def load_torch(path: CheckpointPath, map_location: str | torch.device = "cpu") -> Any:
    """Load what `save_torch` wrote, with weights_only=True.

    weights_only refuses arbitrary pickled objects, so a tampered or foreign file cannot run
    code; everything the trainer checkpoints is plain containers and tensors (see save_torch).
    Loaded to the CPU by default: load_state_dict copies onto the model's device anyway, and a
    checkpoint written on GPU then loads on a CPU-only machine too.
    """
    if isinstance(path, ObjectPath):
        # One streaming download to local disk, then the same load as a local file.
        with tempfile.TemporaryDirectory(prefix="rlkube-download-") as local:
            try:
                path.download(Path(local) / path.name)
            except Exception as error:
                raise CheckpointError(f"cannot load {path}: {error}") from error
            return load_torch(Path(local) / path.name, map_location)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise CheckpointError(f"cannot load {path}: {error}") from error


def capture_rng() -> dict[str, Any]:
    """The global RNG states of this process: Python `random`, NumPy, torch CPU and CUDA.

    NumPy's key array becomes an int64 tensor so the result loads with weights_only=True. CUDA:
    the current device's generator only (one device per rank in SPMD), and only if CUDA is
    already initialised in this process — querying it would otherwise create a CUDA context
    (memory on the GPU) in processes that never use it, like the driver.
    """
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)  # legacy=False always returns the dict form
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"], dtype=np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # untyped in torch
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Restore what `capture_rng` captured; a CUDA state is skipped where there is no GPU."""
    python_state = state["python"]
    # weights_only loading returns the tuples as saved, but JSON-ish round trips give lists.
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np.asarray(np_state["key"], dtype=np.uint32), "pos": int(np_state["pos"])},
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
        else:
            log.warning("checkpoint has a CUDA RNG state but there is no GPU here; CUDA sampling is not restored")


# --- a rank's trainable roles -------------------------------------------------------------------


def save_rank_state(staging: CheckpointPath, trainables: Mapping[str, Checkpointable], rank: int) -> dict[str, Written]:
    """Each trainable role of a rank into `staging/<role>/`: a sharded model's parameters and
    optimizer state through torch.distributed.checkpoint (a collective over the role's group),
    the rest (or all of it, unsharded) in `rank_<rank>.pt` with this process's RNG states.
    Returns the files this rank wrote (relative to `staging`), for the driver to check."""
    files = []
    for part, trainable in trainables.items():
        path = staging / part / f"rank_{rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)  # ranks create their role's folder concurrently
        if trainable.sharded:
            sharded = staging / part / "sharded"
            save_sharded(sharded, trainable.sharded_state_dict())
            save_torch(path, {"local": trainable.local_state_dict(), "rng": capture_rng()})
            # torch.distributed.checkpoint's file system writer: `__<rank>_<n>.distcp` per rank of
            # the group, `.metadata` by its coordinator (rank 0).
            mine: list[CheckpointPath] = sorted(sharded.glob(f"__{rank}_*.distcp"), key=str)
            mine += [sharded / ".metadata"] if rank == 0 else []
            files += [relative(f, staging) for f in mine]
        else:
            save_torch(path, {"state": trainable.state_dict(), "rng": capture_rng()})
        files.append(relative(path, staging))
    return written(staging, files, f"{'/'.join(trainables)} rank {rank}")


# --- the same, written in the background -------------------------------------------------------


def host_copy(obj: Any) -> Any:
    """`obj` with every tensor copied into host memory: a snapshot that later optimizer steps
    (which update parameters and optimizer state in place) cannot change."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {key: host_copy(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [host_copy(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(host_copy(value) for value in obj)
    return obj


_CPU_GROUP: Any = None


def _cpu_group() -> Any:
    """A gloo group of its own over the ranks of the default group, made once (a collective:
    every rank saves at the same time). torch.distributed.checkpoint's background write runs
    its collectives (plans, the metadata) on it while the training thread runs the step's on
    the default group: sharing one communicator, the two threads' collectives would interleave
    in different orders on different ranks (a hang, or one's data in the other's buffer), and
    NCCL has no CPU backend for the staged copy."""
    global _CPU_GROUP  # noqa: PLW0603  (one per process, like the default group)
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized():
        return None
    if _CPU_GROUP is None:
        _CPU_GROUP = dist.new_group(backend="gloo")
    return _CPU_GROUP


_STAGER: Any = None


def _stager() -> Any:
    """The stager of this process's background saves of sharded state: None (torch's default,
    pageable host memory allocated at every save) without CUDA; with it, pinned host buffers
    made at the first save and reused by every later one (torch's BlockingAsyncStager with its
    cache: a rank's parameters and optimizer moments keep their shapes). Reuse is safe because
    the driver finishes a save before it stages the next (loop/saves.py: at most one in flight).
    torch 2.11's DefaultStager, the newer class for this, fails on a plain dict of tensors
    (KeyError: <class 'type'> in its deep copy; docs/benchmarks.md, "GPU: checkpoint saves"). The cost: the
    host keeps the rank's state pinned between saves (docs/trainer.md)."""
    global _STAGER  # noqa: PLW0603  (one per process: its buffers outlive a save)
    if _STAGER is None and torch.cuda.is_available():
        from torch.distributed.checkpoint.staging import BlockingAsyncStager  # noqa: PLC0415

        _STAGER = BlockingAsyncStager(cache_staged_state_dict=True)
    return _STAGER


@dataclass(frozen=True)
class WrittenInBackground:
    """What a rank's background write reports once done: its files and how long it took."""

    files: dict[str, Written]
    seconds: float


class BackgroundSave:
    """One rank's checkpoint parts written by a thread from a copy in host memory, so that
    training goes on meanwhile. The thread only writes below the staging path; the driver
    commits (manager.py) once every rank's `result` is in, so an unfinished or failed write is
    never resumed from. A daemon thread: a process that exits abandons the write, never half
    commits it."""

    def __init__(self, write: Callable[[], dict[str, Written]]) -> None:
        self._files: dict[str, Written] | None = None
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(write,), name="rlkube-checkpoint-write", daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], dict[str, Written]]) -> None:
        start = time.perf_counter()
        try:
            self._files = write()
        except BaseException as error:  # handed to the training thread by result()
            self._error = error
        self._seconds = time.perf_counter() - start

    def result(self, wait: bool) -> WrittenInBackground | None:
        """The files once written (None: still writing and `wait` is False); a failed write
        raises here, in the caller's thread, as the run's error."""
        if not wait and self._thread.is_alive():
            return None
        self._thread.join()
        if self._error is not None:
            raise CheckpointError(f"the background checkpoint write failed: {self._error}") from self._error
        assert self._files is not None
        return WrittenInBackground(self._files, self._seconds)


def stage_rank_state(staging: CheckpointPath, trainables: Mapping[str, Checkpointable], rank: int) -> BackgroundSave:
    """`save_rank_state`, in two halves: the state copied into host memory now (returns once
    it is, before the caller's next optimizer step can change it), the files written by a
    thread. A sharded model's copy and write are torch.distributed.checkpoint's `async_save`
    (the copy is a collective over the role's group, like the blocking save)."""
    from torch.distributed.checkpoint.state_dict_saver import async_save  # noqa: PLC0415

    futures = []
    pending: list[tuple[CheckpointPath, Any]] = []
    mine: list[CheckpointPath] = []
    for part, trainable in trainables.items():
        path = staging / part / f"rank_{rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        if trainable.sharded:
            sharded = staging / part / "sharded"
            if isinstance(sharded, ObjectPath):
                from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # noqa: PLC0415

                future = async_save(
                    trainable.sharded_state_dict(),
                    storage_writer=FsspecWriter(str(sharded), **sharded.options),
                    process_group=_cpu_group(),
                    async_stager=_stager(),
                )
            else:
                future = async_save(
                    trainable.sharded_state_dict(),
                    checkpoint_id=str(sharded),
                    process_group=_cpu_group(),
                    async_stager=_stager(),
                )
            futures.append((sharded, future))
            pending.append((path, {"local": host_copy(trainable.local_state_dict()), "rng": capture_rng()}))
        else:
            pending.append((path, {"state": host_copy(trainable.state_dict()), "rng": capture_rng()}))
        mine.append(path)

    def write() -> dict[str, Written]:
        files = [relative(path, staging) for path in mine]
        for sharded, future in futures:
            future.result()  # type: ignore[union-attr]  # a Future without an async stager of ours
            shards: list[CheckpointPath] = sorted(sharded.glob(f"__{rank}_*.distcp"), key=str)
            shards += [sharded / ".metadata"] if rank == 0 else []
            files += [relative(f, staging) for f in shards]
        for path, obj in pending:
            save_torch(path, obj)
        return written(staging, files, f"{'/'.join(trainables)} rank {rank}")

    return BackgroundSave(write)


def rank_file(checkpoint: CheckpointPath, part: str, rank: int) -> CheckpointPath:
    """The per-rank file rank `rank` resumes `part` from: its own, or rank 0's where the run that
    saved had fewer ranks (resumed on more GPUs). Every rank of a role holds the same scheduler,
    mini-batch generator and (full replicas) model and optimizer, so rank 0's serve any rank."""
    own = checkpoint / part / f"rank_{rank}.pt"
    if own.is_file() or rank == 0:
        return own
    return checkpoint / part / "rank_0.pt"


def load_rank_state(checkpoint: CheckpointPath, trainables: Mapping[str, Checkpointable], rank: int) -> None:
    """What `save_rank_state` wrote, back into the same roles, on any number of ranks and either
    layout: a sharded checkpoint is resharded by torch.distributed.checkpoint (into shards or a
    whole model), full replicas are loaded whole or cut into this run's shards. A rank the saving
    run did not have keeps its own RNG states (seeded per rank, as a fresh run's are)."""
    for part, trainable in trainables.items():
        path = rank_file(checkpoint, part, rank)
        check_checksum(checkpoint, relative(path, checkpoint))
        state = load_torch(path)
        if "local" in state:
            sharded = trainable.sharded_state_dict()
            groups = sharded.get("optimizer", {}).get("param_groups", [])
            own = [list(group["params"]) for group in groups]
            load_sharded(checkpoint / part / "sharded", sharded)
            # The checkpoint's parameter lists are one saving rank's: under a pipeline, one
            # stage's names (a tied LM head under the last stage's). This rank's are its own.
            for group, names in zip(groups, own, strict=True):
                group["params"] = names
            trainable.load_sharded_state_dict(sharded)
            trainable.load_local_state_dict(state["local"])
        elif "state" in state:
            if trainable.sharded:
                trainable.load_full_state_dict(state["state"])
            else:
                trainable.load_state_dict(state["state"])
        else:
            raise CheckpointError(f"{path}: neither a sharded nor a full {part} state")
        if path.name == f"rank_{rank}.pt":
            restore_rng(state["rng"])
        else:
            log.info("%s rank %d: resuming from %s (the checkpoint had fewer ranks)", part, rank, path)
