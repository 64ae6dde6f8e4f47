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


def keep_rows_through(jsonl: Path, step: int) -> None:
    """Drops the rows of a metrics-style JSON-lines file logged after `step` (all of them for a
    negative step): a resumed run redoes those steps and would log them twice."""
    if not jsonl.exists():
        return
    lines = [line for line in jsonl.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        jsonl.write_text("".join(line + "\n" for line in kept))


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
            keys = [*CONSOLE_KEYS, *(k for k in metrics if k.startswith("val-core/"))]
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)
            log.info("step %d %s", step, shown)
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)

    def rewind(self, step: int) -> None:
        keep_rows_through(self.jsonl, step)

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
        # Validation: the core mean@N of each data source, when the run validated.
        validation = sorted({k for r in rows for k in r if k.startswith("val-core/") and "/mean@" in k})
        panels = len(CURVES) + bool(validation)
        fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.2))
        if validation:
            ax = axes[-1]
            for name in validation:
                points = [(r["step"], r[name]) for r in rows if name in r]
                ax.plot(
                    [p[0] for p in points], [p[1] for p in points], marker="o", label=name.removeprefix("val-core/")
                )
            ax.set_title("validation (val-core)")
            ax.set_xlabel("step")
            ax.legend(fontsize="small")
        for ax, (title, keys) in zip(axes, CURVES, strict=False):
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
