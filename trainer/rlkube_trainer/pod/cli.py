"""`rlkube-trainer`:

- `run CONFIG.yaml`: a local Ray with every role as a worker group, the driver
  here — the same code path as in pods;
- `driver`: the controller pod: Ray head + driver (config from $RLKUBE_CONFIG);
- `node --role ROLE`: a role pod: joins the head, advertises its role and pod
  index, serves /healthz, stays up until the driver ends;
- `tiny-task DIR`: writes the tiny CPU task (model, data, reward, config);
- `convert VERL.yaml`: a verl config as a trainer YAML or an RLJob (rlkube_api/verl).
- `data gsm8k|math SRC DEST`: Hugging Face parquet files as verl-format rows.
- `fetch URI DEST`: a model or data (s3://, hf://) into the folder DEST, once (rlkube_trainer/fetch);
  with `--wait`, only waits until another pod's fetch put it there.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from rlkube_api.config import ADV_ESTIMATORS, TrainerConfig
from rlkube_api.exit_codes import ExitCode
from rlkube_api.names import DRIVER_LOG_FILE, NODE_HEALTH_PORT, Env
from rlkube_api.validation import InvalidSpec, load_trainer_config
from rlkube_api.verl import command as verl_convert

log = logging.getLogger("rlkube.trainer")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The driver waits this long for every role pod to join before giving up.
NODES_TIMEOUT = 900.0


def _load(path: Path) -> TrainerConfig:
    try:
        return load_trainer_config(path)
    except InvalidSpec as exc:
        raise SystemExit(_fail(ExitCode.CONFIG, str(exc))) from None


def _fail(code: ExitCode, message: str) -> int:
    """Reports an error on stderr, as the container's termination message (in a pod, the
    operator puts it into the job's condition and Event) and as an Event about the pod, which
    outlives it (exit_record.py); returns the exit code."""
    from rlkube_trainer.pod.exit_record import record_exit  # noqa: PLC0415
    from rlkube_trainer.pod.preflight import write_termination_message  # noqa: PLC0415

    print(f"error: {message}", file=sys.stderr)
    said = f"exit code {int(code)} ({code.name}): {message}"
    write_termination_message(said)
    record_exit(int(code), said)
    return int(code)


SIGTERM_MESSAGE = "stopped by SIGTERM: the pod was deleted, preempted or drained from its node"


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    from rlkube_trainer.loop.termination import TERMINATION  # noqa: PLC0415  (imported by _in_pod already)
    from rlkube_trainer.pod.preflight import write_termination_message  # noqa: PLC0415  (imported by _in_pod already)

    if TERMINATION.take(signum):
        # The training loop stops after the step in progress and saves it (termination.py);
        # until then this says why, should the grace period end first.
        write_termination_message(SIGTERM_MESSAGE + "; saving a checkpoint after the step in progress")
        log.warning("SIGTERM: stopping after the step in progress, with a checkpoint")
        return
    # The pod's termination message says why it ended, instead of the log's last lines (the
    # operator puts it into the job's condition and Event).
    write_termination_message(SIGTERM_MESSAGE)
    # SystemExit, not an Exception: no handler of the trainer's takes it for an error, and
    # `finally` blocks (the Ray worker a role pod started, the health server) still run.
    raise SystemExit(128 + signum)


def _in_pod(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A pod's command: an error nothing else caught exits UNEXPECTED and is reported as `_fail`
    reports the others, with its traceback (whose end names the error). SIGTERM (the kubelet
    stopping the pod) exits at once with 128 + 15: as a container's first process the trainer
    would otherwise ignore it (the kernel drops signals to PID 1 that have no handler) and be
    killed only at the end of the grace period."""

    def run(args: argparse.Namespace) -> int:
        import rlkube_trainer.pod.preflight  # noqa: F401, PLC0415  (loaded before a signal needs it)
        from rlkube_trainer.loop.termination import Terminated  # noqa: PLC0415
        from rlkube_trainer.pod.preflight import write_termination_message  # noqa: PLC0415

        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return handler(args)
        except Terminated as stopped:
            write_termination_message(stopped.message)
            return int(stopped.code or 0)
        except Exception:
            return _fail(ExitCode.UNEXPECTED, traceback.format_exc().strip())

    return run


def _classified(exc: Exception) -> int:
    """Exits with the failure class of `exc` (failures.py); an unclassified error with its
    traceback, whose end names it."""
    from rlkube_trainer.pod.failures import exit_code_of, failure_message  # noqa: PLC0415

    code = exit_code_of(exc)
    if code is ExitCode.UNEXPECTED:
        return _fail(code, "".join(traceback.format_exception(exc)).strip())
    return _fail(code, failure_message(exc, code))


def _finish(result: object) -> int:
    from rlkube_trainer.loop.training_run import RunResult  # noqa: PLC0415

    assert isinstance(result, RunResult)
    last = result.history[-1] if result.history else {}
    print(f"done: {result.steps} steps; critic/score/mean {last.get('critic/score/mean', float('nan')):.3f}")
    print(f"checkpoint: {result.last_checkpoint}")
    print(f"metrics:    {result.output_dir / 'metrics.jsonl'}")
    print(f"curves:     {result.curves}")
    return 0


def _run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if (code := _preflight(config)) is not None:
        return code
    # torch and Ray: imported only when running (and after the cheap checks).
    from rlkube_api.placement import placement_of  # noqa: PLC0415
    from rlkube_trainer.loop import driver  # noqa: PLC0415
    from rlkube_trainer.pod import ray_node  # noqa: PLC0415

    try:
        if args.in_process:
            return _finish(driver.run_in_process(config, args.steps, not args.no_progress))
        ray_node.start_local_ray(placement_of(config))
        return _finish(driver.run_distributed(config, None, args.steps, not args.no_progress))
    except Exception as exc:
        return _classified(exc)


def _preflight(config: TrainerConfig) -> int | None:
    """The driver's checks (preflight.check_driver); the exit code when one fails."""
    from rlkube_trainer.cluster.config_errors import PreflightError  # noqa: PLC0415
    from rlkube_trainer.pod.failures import exit_code_of  # noqa: PLC0415
    from rlkube_trainer.pod.preflight import check_driver  # noqa: PLC0415

    try:
        check_driver(config)
    except PreflightError as exc:
        return _fail(exit_code_of(exc), str(exc))
    return None


def _driver(args: argparse.Namespace) -> int:
    config = _load(Path(os.environ.get(Env.CONFIG, args.config)))
    # Before the Ray head starts, so before anyone waits for anyone: a deterministic error
    # ends the job at once (the operator does not restart ExitCode.CONFIG).
    if (code := _preflight(config)) is not None:
        return code
    _log_to_checkpoint_dir(Path(config.checkpoint.dir))
    from rlkube_api.placement import placement_of  # noqa: PLC0415
    from rlkube_trainer.loop import driver  # noqa: PLC0415
    from rlkube_trainer.loop.progress import reporter_from_env  # noqa: PLC0415
    from rlkube_trainer.pod import ray_node  # noqa: PLC0415

    try:
        ray_node.start_ray_head()
        # ray.init put its own SIGTERM handler in place of _in_pod's (it exits with 15 and
        # leaves no termination message): ours again.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        ray_node.wait_for_nodes(placement_of(config), NODES_TIMEOUT)
        code = _finish(driver.run_distributed(config, reporter_from_env(), None, False))
    except Exception as exc:
        # Each class its own code: the operator fails the job at once on a permanent one and
        # restarts the gang (from the last checkpoint) on a lost rank or missing pods.
        return _classified(exc)
    from rlkube_trainer.pod.finished_run import idle_until_stopped, record_finished  # noqa: PLC0415

    # An exit would be restarted by the kubelet (restartPolicy Always): the finished run is
    # recorded on the pod and the driver idles until the operator deletes the pods.
    if code == 0 and record_finished():
        idle_until_stopped()
    return code


def _log_to_checkpoint_dir(folder: Path) -> None:
    """The driver's log goes to checkpoint.dir too (appended to by each container start), beside
    metrics.jsonl: the pod's own log goes with the pod, and a finished job's pods are deleted
    at its end (`kubectl rlkube logs` reads this file then). Best effort: a folder that cannot
    be written to fails the run later, naming it, where checkpoints are written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(folder / DRIVER_LOG_FILE)
    except OSError as exc:
        log.warning("the driver's log is not kept in %s: %s", folder, exc)
        return
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)


def _node(args: argparse.Namespace) -> int:
    from rlkube_trainer.pod.health import HealthServer  # noqa: PLC0415

    role = args.role or os.environ.get(Env.ROLE)
    if not role:
        print(f"error: --role is required (or {Env.ROLE} in the environment)", file=sys.stderr)
        return 2
    # Serving /healthz first: the liveness probe starts 30 s after the container, and the
    # checks and torch's import below can take longer than that on a loaded node.
    health = HealthServer(args.health_port, lambda: True)
    health.start()
    try:
        return _join(args, role)
    finally:
        health.stop()


def _join(args: argparse.Namespace, role: str) -> int:
    from rlkube_trainer.pod import ray_node  # noqa: PLC0415

    if os.environ.get(Env.CONFIG):
        # The files this pod's roles load, checked before it joins (and holds its GPUs for) the driver.
        from rlkube_trainer.cluster.config_errors import PreflightError  # noqa: PLC0415
        from rlkube_trainer.pod.failures import exit_code_of  # noqa: PLC0415
        from rlkube_trainer.pod.preflight import check_group  # noqa: PLC0415

        try:
            check_group(_load(Path(os.environ[Env.CONFIG])), role)
        except PreflightError as exc:
            return _fail(exit_code_of(exc), str(exc))
    from rlkube_trainer.loop.termination import TERMINATION  # noqa: PLC0415

    gpus = int(os.environ.get(Env.PET_NPROC_PER_NODE, "1")) if args.gpus is None else args.gpus
    gpus = gpus if _has_gpu() else 0
    # A SIGTERM (the gang deleted for a restart or a suspend) keeps this pod's ranks up until
    # the driver has saved the step in progress and ended, or the grace period ends; with no
    # head to serve (still joining, or gone) the pod exits at once.
    with TERMINATION.arm(ray_node.head_reachable):
        code = ray_node.join_as_node(role, gpus)
    return 128 + TERMINATION.signum if TERMINATION.signum is not None else code


def _has_gpu() -> bool:
    import torch  # noqa: PLC0415

    return bool(torch.cuda.is_available())


def _tiny_task(args: argparse.Namespace) -> int:
    from rlkube_trainer.tiny.task import init  # noqa: PLC0415

    print(init(args.workdir, args.adv_estimator, args.steps))
    return 0


def _data(args: argparse.Namespace) -> int:
    from rlkube_trainer.data.prepare import prepare  # noqa: PLC0415
    from rlkube_trainer.data.prompts import DataError  # noqa: PLC0415

    try:
        written = prepare(args.dataset, args.src, args.dest)
    except (DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from rlkube_trainer.fetch.run import FetchError, fetch, wait_for  # noqa: PLC0415

    try:
        if args.wait is not None:
            wait_for(args.uri, args.dest, args.wait)
        else:
            fetch(args.uri, args.dest, args.endpoint_url, "dataset" if args.dataset else "model")
    except FetchError as exc:
        return _fail(exc.code, str(exc))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube-trainer", description="rlkube's RL trainer")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train locally: a local Ray, every role as a worker group")
    run.add_argument("config", type=Path, help="trainer YAML (verl-style keys)")
    run.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--in-process", action="store_true", help="every role in this process, without Ray")
    run.set_defaults(handler=_run)
    driver = sub.add_parser("driver", help="the controller pod: Ray head and driver")
    driver.add_argument("--config", type=Path, default=Path("/etc/rlkube/config.yaml"))
    driver.set_defaults(handler=_in_pod(_driver))
    node = sub.add_parser("node", help="a role pod: join the Ray head as ROLE")
    node.add_argument(
        "--role", choices=["actor", "critic", "reference", "reward", "rollout"], help=f"default: ${Env.ROLE}"
    )
    node.add_argument("--gpus", type=int, default=None, help="GPUs to advertise (default: PET_NPROC_PER_NODE)")
    node.add_argument("--health-port", type=int, default=NODE_HEALTH_PORT)
    node.set_defaults(handler=_in_pod(_node))
    tiny = sub.add_parser("tiny-task", help="write the tiny CPU task (model, data, reward, config) into DIR")
    tiny.add_argument("workdir", type=Path)
    tiny.add_argument("--adv-estimator", default="grpo", choices=ADV_ESTIMATORS)
    tiny.add_argument("--steps", type=int, default=60)
    tiny.set_defaults(handler=_tiny_task)
    convert = sub.add_parser("convert", help="map a verl config to a trainer YAML (or, with --rljob, an RLJob)")
    verl_convert.add_arguments(convert)
    convert.set_defaults(handler=verl_convert.run)
    data = sub.add_parser("data", help="turn Hugging Face parquet files of a dataset into verl-format rows")
    data.add_argument("dataset", choices=["gsm8k", "math"])
    data.add_argument("src", type=Path, help="a parquet file, or a folder of them (split from each file's name)")
    data.add_argument("dest", type=Path, help="folder for <split>.parquet")
    data.set_defaults(handler=_data)
    fetch = sub.add_parser("fetch", help="fetch a model or data (s3://, hf://) into a folder once")
    fetch.add_argument("uri", help="s3://bucket/prefix or hf://org/name[@revision]")
    fetch.add_argument("dest", type=Path, help="the folder to fill (model.path, data.dir)")
    fetch.add_argument("--endpoint-url", default=None, help="an S3-compatible server, or a Hub mirror (HF_ENDPOINT)")
    fetch.add_argument("--dataset", action="store_true", help="hf://: a dataset repo (data.uri)")
    fetch.add_argument("--wait", type=float, default=None, metavar="SECONDS", help="only wait for another's fetch")
    fetch.set_defaults(handler=_in_pod(_fetch))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
