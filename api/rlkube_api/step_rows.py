"""A run's step rows (metrics.jsonl's `{"step": n, name: value}`) as people see them: the driver's
console line and the curves. The driver writes both (rlkube_trainer/loop/tracking.py);
`kubectl rlkube curves` reads the lines back from the driver's log and draws the same curves, so
the line's format and the picture are defined here, once, for both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger("rlkube")

# The metrics a console line shows (validation's val-core/ metrics follow when a row has them).
CONSOLE_KEYS = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/ppo_kl",
    "critic/vf_loss",
    "response_length/mean",
    "timing_s/step",
    "perf/throughput",
)
# A console line: "... step 12 critic/score/mean=0.5 actor/pg_loss=-0.01 ...".
_STEP_LINE = re.compile(r"\bstep (\d+)((?: [\w/@.-]+=\S+)+)\s*$")
# The curves' panels: (title, metric names tried in order).
CURVES = (
    ("reward (critic/score/mean)", ("critic/score/mean",)),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("response length (mean)", ("response_length/mean",)),
)


def step_line(step: int, metrics: Mapping[str, float]) -> str:
    """The console line of a step's row."""
    keys = [*CONSOLE_KEYS, *(k for k in metrics if k.startswith("val-core/"))]
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)
    return f"step {step} {shown}"


def parse_step_lines(text: str) -> list[dict[str, float]]:
    """The console lines in a log as rows like metrics.jsonl's; a restarted driver's repeated
    steps keep the latest value."""
    rows: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        match = _STEP_LINE.search(line)
        if not match:
            continue
        row: dict[str, float] = {"step": int(match.group(1))}
        for pair in match.group(2).split():
            key, _, value = pair.partition("=")
            try:
                row[key] = float(value)
            except ValueError:
                continue
        rows[int(row["step"])] = row
    return [rows[step] for step in sorted(rows)]


def plot_curves(rows: Sequence[Mapping[str, float]], path: Path) -> bool:
    """Draws the reward, KL and response-length curves (and validation's, when the rows have
    them) into the PNG `path`; False without matplotlib (an optional extra: a picture is not
    worth failing a finished run for, metrics.jsonl has the numbers)."""
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    # Validation: the core mean@N of each data source, when the run validated.
    validation = sorted({k for r in rows for k in r if k.startswith("val-core/") and "/mean@" in k})
    panels = len(CURVES) + bool(validation)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.2))
    if validation:
        ax = axes[-1]
        for name in validation:
            points = [(r["step"], r[name]) for r in rows if name in r]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name.removeprefix("val-core/"))
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
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return True
