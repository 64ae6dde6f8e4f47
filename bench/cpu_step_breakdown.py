"""CPU step-time breakdown of the in-process trainer on the tiny task (a benchmark,
not a test). Writes the tiny task into a temporary folder, runs N steps with vLLM
(CPU) rollout, and prints the median of each timing_s/* metric and perf/throughput.

    .venv/bin/python bench/cpu_step_breakdown.py --estimator grpo --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rlkube_trainer.tiny.task import init

KEYS = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "step",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--estimator", default="grpo", choices=["grpo", "gae", "rloo", "reinforce_plus_plus"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the medians")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        config = init(workdir, args.estimator, args.steps)
        subprocess.run(
            [sys.executable, "-m", "rlkube_trainer.pod.cli", "run", str(config), "--no-progress"],
            check=True,
            capture_output=True,
        )
        rows = [json.loads(x) for x in (workdir / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    rows = rows[args.skip :]
    print(f"tiny task, {args.estimator}, {len(rows)} steps after {args.skip} warm-up; medians:")
    print("| phase | seconds |\n|---|---|")
    for key in KEYS:
        values = [r[f"timing_s/{key}"] for r in rows if f"timing_s/{key}" in r]
        if values:
            print(f"| timing_s/{key} | {statistics.median(values):.4f} |")
    print(f"| perf/throughput (tokens/s) | {statistics.median(r['perf/throughput'] for r in rows):.0f} |")
    print(f"| perf/total_num_tokens | {statistics.median(r['perf/total_num_tokens'] for r in rows):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
