"""trainer.v1.trainer_mode colocate_async on the tiny task, end to end: `rlkube-trainer run
--in-process` with the real vLLM CPU engine generating the next batch on the rollout thread
while the actor updates. The rows must show every batch trained within the staleness bound
(training/off_policy/*), batches after the first generated one version behind (the generation
overlapped the previous update: it started before those weights existed), a weight push per
update, and distinct, consecutive batches (each seeded by its own index)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlkube_trainer.tiny_task import init

STEPS = 6
THRESHOLD = 2  # span <= 2: one step off at most


@pytest.mark.trainer
def test_colocate_async_trains_one_step_off_within_the_bound(tmp_path: Path) -> None:
    config = init(tmp_path, "grpo", STEPS)
    raw = yaml.safe_load(config.read_text())
    raw["trainer"].update({"test_freq": -1, "val_before_train": False})
    raw["trainer"]["v1"] = {
        "trainer_mode": "colocate_async",
        "sampler": {"max_off_policy_threshold": THRESHOLD, "max_off_policy_strategy": "drop"},
    }
    raw["rollout"]["free_cache_engine"] = False  # refused otherwise: the engine generates while the actor trains
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube_trainer.cli", "run", str(config), "--in-process", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == STEPS
    staleness = [r["training/off_policy/trajectory_staleness/max"] for r in rows]
    worst = [r["training/off_policy/trajectory_staleness_worst/max"] for r in rows]
    # staleness = versions behind = span - 1
    assert max(staleness + worst) <= THRESHOLD - 1, staleness
    assert staleness[0] == 0  # the first batch waits for the initial weights' generation
    assert staleness[1:].count(1) >= STEPS - 2, f"the schedule did not overlap: {staleness}"
    assert all(r["training/off_policy/evicted_samples"] == 0 for r in rows)  # one step off never exceeds 2
    assert all(r["timing_s/gen"] > 0 and "timing_s/wait_trainer" in r for r in rows)
    assert [r["training/batch_index"] for r in rows] == [float(i) for i in range(1, STEPS + 1)]
    assert len({r["data/order_checksum"] for r in rows}) > 1
    # colocate_async pushes the weights after every update, between generations.
    assert all(r["timing_s/update_weights"] > 0 for r in rows[1:])
