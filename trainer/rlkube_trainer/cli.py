"""`rlkube-trainer`: run a config locally (`run CONFIG.yaml`), and write the tiny
task's model and data (`tiny-task DIR`)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rlkube_api.validation import InvalidSpec, load_trainer_config


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_trainer_config(args.config)
    except InvalidSpec as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from rlkube_trainer.driver import run_in_process  # noqa: PLC0415  (torch, vLLM: only when running)

    result = run_in_process(config, max_steps=args.steps, progress=not args.no_progress)
    last = result.history[-1] if result.history else {}
    print(f"done: {result.steps} steps; critic/score/mean {last.get('critic/score/mean', float('nan')):.3f}")
    print(f"metrics: {result.output_dir / 'metrics.jsonl'}")
    print(f"curves:  {result.curves}")
    return 0


def _tiny_task(args: argparse.Namespace) -> int:
    from rlkube_trainer.tiny_task import init  # noqa: PLC0415

    print(init(args.workdir, args.adv_estimator, args.steps))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkube-trainer", description="rlkube's RL trainer")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train with every role in this process (CPU or one GPU)")
    run.add_argument("config", type=Path, help="trainer YAML (verl-style keys)")
    run.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(handler=_run)
    tiny = sub.add_parser("tiny-task", help="write the tiny CPU task (model, data, reward, config) into DIR")
    tiny.add_argument("workdir", type=Path)
    tiny.add_argument("--adv-estimator", default="grpo", choices=["grpo", "gae", "rloo", "reinforce_plus_plus"])
    tiny.add_argument("--steps", type=int, default=60)
    tiny.set_defaults(handler=_tiny_task)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
