"""Where step metrics go: a console line, metrics.jsonl, optional TensorBoard event
files, and at the end a PNG of the reward, KL and response-length curves."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("rlkube.trainer")

CONSOLE_KEYS = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/ppo_kl",
    "critic/vf_loss",
    "response_length/mean",
    "timing_s/step",
    "perf/throughput",
)
# (title, metric names tried in order)
CURVES = (
    ("reward (critic/score/mean)", ("critic/score/mean",)),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("response length (mean)", ("response_length/mean",)),
)


class Tracker:
    def __init__(self, output_dir: Path, loggers: list[str], experiment: str) -> None:
        self.output_dir = output_dir
        output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = output_dir / "metrics.jsonl"
        self.console = "console" in loggers
        self.tensorboard: Any = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (heavy; only when asked)

            self.tensorboard = SummaryWriter(str(output_dir / "tensorboard" / experiment))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.jsonl.open("a") as out:
            out.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.console:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            log.info("step %d %s", step, shown)
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)

    def history(self) -> list[dict[str, float]]:
        if not self.jsonl.exists():
            return []
        return [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]

    def plot(self) -> Path | None:
        """Writes curves.png from metrics.jsonl; returns its path, or None without matplotlib
        (a picture is not worth failing a finished run for: metrics.jsonl has the numbers)."""
        try:
            import matplotlib  # noqa: PLC0415
        except ImportError:
            log.warning("matplotlib is not installed: no curves.png (the numbers are in %s)", self.jsonl)
            return None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        rows = self.history()
        fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
        for ax, (title, keys) in zip(axes, CURVES, strict=True):
            key = next((k for k in keys if any(k in r for r in rows)), None)
            if key is not None:
                points = [(r["step"], r[key]) for r in rows if key in r]
                ax.plot([p[0] for p in points], [p[1] for p in points])
                ax.set_ylabel(key)
            ax.set_title(title)
            ax.set_xlabel("step")
        fig.tight_layout()
        path = self.output_dir / "curves.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
