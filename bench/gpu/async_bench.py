#!/usr/bin/env python3
"""Asynchronous GRPO (`trainer.v1.trainer_mode: colocate_async`) against synchronous
GRPO, back to back in one process, at grpo_bench.py's shape on one GPU.

Every run is `TrainingRun.fit`, the driver's own loop: `sync` runs `_sync_steps`
(PPOTrainer.step), `colocate_async` runs `_async_steps` (OneStepOff: batch k+1 generates on the
rollout thread while the actor updates on batch k, in the same process and on the same GPU). One
engine and one actor serve every run (assembled as grpo_bench.py assembles them, the driver's
roles over one rank of this process); each run has its own PPOTrainer, loader and checkpoint
folder. The numbers are the trainer's own rows: timing_s/*, perf/throughput.

With --profile, one more step per run (left out of the means) shows what the overlap does:
  - phases: when generation and the actor update ran, and the CUDA stream each thread was on
    (wrappers around roles.rollout.generate and actor.update);
  - GIL: a probe thread sleeps 1 ms at a time and records how late it wakes (it waits for the
    GIL when another thread holds it);
  - kernels: a torch.profiler window of CUDA activity (about 1 s: 50 engine steps, or 6 of the
    update's 32 micro-batches) during generation alone and the update alone (sync), and both at
    once (async): device busy time per stream, and how long two streams ran kernels at once.

  python3 bench/gpu/async_bench.py --out OUT/async.json --runs sync,colocate_async --profile
  python3 bench/gpu/async_bench.py --tiny --out /tmp/async.json --steps 2 --profile   # CPU smoke test
  python3 bench/gpu/async_bench.py report OUT/async.json
  python3 bench/gpu/async_bench.py trace OUT/trace-colocate_async.json.gz   # the overlap window, binned

Runs (--runs, comma-separated, in order; a name may repeat):
  sync                        generate, update, push: one step at a time
  sync_logprobs               the same with the engine's log-probs (rollout.calculate_log_probs),
                              which the asynchronous modes always ask for
  colocate_async              one step off, generation on the rollout thread, its kernels on a
                              CUDA stream of its own (the trainer's rollout/stream.py, as its
                              colocated ranks run it)
  colocate_async_one_stream   the same with every kernel on the default stream (what the stream
                              of its own is measured against)
"""

# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import shutil
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_bench as gb  # sets the trainer's import path and vLLM's env first
import torch


@dataclass(frozen=True)
class RunKind:
    trainer_mode: str
    overrides: tuple[str, ...] = ()
    side_stream: bool = False


RUNS = {
    "sync": RunKind("sync"),
    "sync_logprobs": RunKind("sync", ("rollout.calculate_log_probs=true",)),
    "colocate_async": RunKind("colocate_async", side_stream=True),
    "colocate_async_one_stream": RunKind("colocate_async"),
}

# Profile windows, in engine steps (of 512 decode steps) and actor micro-batches (of 32); the
# tiny shape has 8 and 2.
WINDOWS = {"full": ((100, 150), (5, 11)), "tiny": ((2, 6), (1, 2))}
GIL_PROBE_SLEEP = 0.001


# --------------------------------------------------------------------------- what the overlap does


@dataclass
class Span:
    phase: str  # gen | update
    thread: str
    start: float
    end: float
    stream: str


@dataclass
class Window:
    name: str
    wall_s: float = 0.0
    kernels: dict[str, Any] = field(default_factory=dict)
    gil: dict[str, float] = field(default_factory=dict)
    trace: Path | None = None


def current_stream() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    stream = torch.cuda.current_stream()
    default = torch.cuda.default_stream()
    return "default" if stream == default else f"0x{stream.cuda_stream:x}"


class GilProbe:
    """Sleeps GIL_PROBE_SLEEP at a time; the lateness of each wake-up is time spent waiting for
    the GIL (plus the OS timer's slack, seen alone when nothing else runs)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            time.sleep(GIL_PROBE_SLEEP)
            self.lags.append(time.perf_counter() - start - GIL_PROBE_SLEEP)

    def __enter__(self) -> GilProbe:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict[str, float]:
        lags = sorted(self.lags)
        if not lags:
            return {}
        return {
            "wakeups": len(lags),
            "lag_mean_ms": statistics.fmean(lags) * 1e3,
            "lag_p50_ms": lags[len(lags) // 2] * 1e3,
            "lag_p90_ms": lags[int(len(lags) * 0.9)] * 1e3,
            "lag_max_ms": lags[-1] * 1e3,
        }


def merged_seconds(intervals: list[tuple[int, int]]) -> float:
    """Length of the union of [start, end) nanosecond intervals."""
    total, end = 0, None
    start = 0
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total / 1e9


def device_activity(prof: Any, wall: float) -> dict[str, Any]:
    """Per stream (CUDA) or per thread (CPU runs): activity count, busy seconds and the busiest
    names; across them: busy seconds of any, and seconds with two or more busy at once."""
    on_cuda = torch.cuda.is_available()
    lanes: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for event in prof.profiler.kineto_results.events():
        device = str(event.device_type())
        if on_cuda != device.endswith("CUDA"):
            continue
        if event.duration_ns() <= 0:
            continue
        lane = f"stream {event.device_resource_id()}" if on_cuda else f"thread {event.start_thread_id()}"
        lanes[lane].append((event.start_ns(), event.end_ns(), event.name()))
    out: dict[str, Any] = {"wall_s": wall, "lanes": {}}
    every: list[tuple[int, int]] = []
    busy_sum = 0.0
    for lane, items in sorted(lanes.items(), key=lambda kv: -len(kv[1])):
        spans = [(s, e) for s, e, _ in items]
        busy = merged_seconds(spans)
        busy_sum += busy
        every += spans
        by_name: dict[str, float] = defaultdict(float)
        for s, e, name in items:
            by_name[name[:90]] += (e - s) / 1e9
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
        out["lanes"][lane] = {"count": len(items), "busy_s": busy, "top": [[n, round(t, 5)] for n, t in top]}
    union = merged_seconds(every)
    out["busy_any_s"] = union
    out["busy_fraction"] = union / wall if wall > 0 else float("nan")
    # Time during which more than one lane was busy (summed per extra lane).
    out["concurrent_s"] = busy_sum - union
    return out


@dataclass
class Armed:
    """A window to open on the `start`-th tick of `counter` and close on the `stop`-th (or when
    the phase call it belongs to returns)."""

    window: Window
    counter: str  # engine_step | micro_batch
    start: int
    stop: int
    ticks: int = 0


class Probe:
    """Records the phases of the current run and opens the profile windows of its profiled step.
    A window opens and closes on the main thread only (kineto wants one thread; two sessions at
    once crash it), counted in engine steps (generation alone, sync mode: generation runs on the
    main thread) or in the actor's micro-batches (the update, alone or beside the rollout thread)."""

    def __init__(
        self, out_dir: Path, profile: bool, gen_steps: tuple[int, int], micro_batches: tuple[int, int]
    ) -> None:
        self.out_dir = out_dir
        self.profile = profile
        self.gen_steps = gen_steps
        self.micro_batches = micro_batches
        self.spans: list[Span] = []
        self.windows: list[Window] = []
        self.run_name = ""
        self.mode = "sync"
        self.profiled_call = 0
        self.calls: dict[str, int] = defaultdict(int)
        self.armed: Armed | None = None
        self.session: Any = None
        self.gil: GilProbe | None = None
        self.started = 0.0
        self.lock = threading.Lock()

    def begin_run(self, name: str, mode: str, profiled_call: int | None) -> None:
        self.spans, self.windows = [], []
        self.run_name, self.mode = name, mode
        self.calls = defaultdict(int)
        self.profiled_call = profiled_call if self.profile and profiled_call is not None else 0

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A phase call (gen | update): timed; the profiled one arms its window."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls[phase] += 1
                call = self.calls[phase]
            main = threading.current_thread() is threading.main_thread()
            armed = None
            if main and call == self.profiled_call and (phase == "update" or self.mode == "sync"):
                if phase == "gen":
                    armed = Armed(Window("gen_alone"), "engine_step", *self.gen_steps)
                else:
                    armed = Armed(
                        Window("update_alone" if self.mode == "sync" else "overlap"), "micro_batch", *self.micro_batches
                    )
                self.windows.append(armed.window)
                self.armed = armed
            start = time.perf_counter()
            stream = current_stream()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                if armed is not None:
                    self._close()
                    self.armed = None
                with self.lock:
                    self.spans.append(Span(phase, threading.current_thread().name, start, end, stream))

        return wrapped

    def counted(self, counter: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """An engine step or a micro-batch: a tick of its counter before it runs."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            armed = self.armed
            if armed is not None and armed.counter == counter and threading.current_thread() is threading.main_thread():
                armed.ticks += 1
                if armed.ticks == armed.start:
                    self._open()
                elif armed.ticks == armed.stop:
                    self._close()
            return fn(*args, **kwargs)

        return wrapped

    def _open(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
        self.gil = GilProbe().__enter__()
        self.session = profile(activities=[activity])
        self.session.__enter__()
        self.started = time.perf_counter()

    def _close(self) -> None:
        if self.session is None or self.armed is None:
            return
        window, session, gil = self.armed.window, self.session, self.gil
        self.session, self.gil = None, None
        try:
            session.__exit__(None, None, None)
            window.wall_s = time.perf_counter() - self.started
            if gil is not None:
                gil.__exit__()
                window.gil = gil.summary()
            window.kernels = device_activity(session, window.wall_s)
            if window.name == "overlap":
                raw = self.out_dir / f"trace-{self.run_name}.json"
                session.export_chrome_trace(str(raw))
                window.trace = raw.with_suffix(".json.gz")
                with raw.open("rb") as src, gzip.open(window.trace, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                raw.unlink()
        except Exception as exc:  # a profile is a diagnosis: the run's numbers stand without it
            window.kernels = {"error": f"{type(exc).__name__}: {exc}"[:500]}

    def finish(self) -> dict[str, Any]:
        return {
            "spans": [s.__dict__ for s in self.spans],
            "streams": sorted({f"{s.phase}: {s.thread} on {s.stream}" for s in self.spans}),
            "overlap_s": overlap_seconds(self.spans),
            "windows": [
                {"name": w.name, "wall_s": w.wall_s, "gil": w.gil, "kernels": w.kernels, "trace": str(w.trace or "")}
                for w in self.windows
            ],
        }


def overlap_seconds(spans: list[Span]) -> float:
    """Seconds during which generation and the update both ran."""
    gens = [s for s in spans if s.phase == "gen"]
    updates = [s for s in spans if s.phase == "update"]
    return sum(max(0.0, min(g.end, u.end) - max(g.start, u.start)) for g in gens for u in updates)


def on_side_stream(generate: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """Generation as the trainer's colocated rank runs it in colocate_async (Rank.generate):
    inside rollout/stream.py's GenerationStream (a no-op on a CPU)."""
    from rlkube_trainer.rollout.stream import GenerationStream

    stream = GenerationStream(device, enabled=True)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with stream.generating():
            return generate(*args, **kwargs)

    return wrapped


# --------------------------------------------------------------------------- the runs


class NoCheckpoints:
    """GroupState without the writes: a benchmark's final checkpoint (6 GB of actor and
    optimizer state) would only add disk time after the last row."""

    def save(self, staging: Path) -> dict[str, Any]:
        del staging
        return {}  # no rank wrote anything: the checkpoint holds the driver's state alone

    def save_in_background(self, staging: Path) -> None:
        del staging

    def written_in_background(self, wait: bool) -> tuple[dict[str, Any], float]:
        del wait
        return {}, 0.0

    def load(self, checkpoint: Path) -> None:
        del checkpoint

    def export_hf(self, path: Path) -> None:
        del path


def summarize(history: list[dict[str, float]], shape: dict[str, int], steps: int) -> dict[str, float]:
    """Means over the rows after the first and up to `steps` (the first is warm-up: in the
    asynchronous modes it also holds the first batch's generation, which nothing overlaps)."""
    steady = history[1:steps] if steps > 1 else history[:1]
    keys = sorted({k for m in steady for k in m if k.startswith(("timing_s/", "perf/", "training/off_policy/"))})
    out = {k: statistics.fmean(m[k] for m in steady if k in m) for k in keys}
    out["gen_tokens_per_s"] = shape["prompts"] * shape["n"] * shape["response_len"] / out["timing_s/gen"]
    out["rows_averaged"] = len(steady)
    out["rows"] = len(history)
    return out


def main_run(args: argparse.Namespace) -> int:
    from rlkube_trainer.data.prompts import PromptLoader
    from rlkube_trainer.loop.driver import seed_everything
    from rlkube_trainer.loop.ppo import PPOTrainer
    from rlkube_trainer.loop.roles import Roles
    from rlkube_trainer.loop.training_run import TrainingRun
    from rlkube_trainer.model.loading import load_tokenizer
    from rlkube_trainer.reward.scoring import build_reward_scorer
    from rlkube_trainer.rollout import build_engine
    from rlkube_trainer.workers.builders import build_actor

    res = gb.Results(args.out)
    out_dir = Path(args.out).parent
    arch, shape = (gb.TINY, gb.TINY_SHAPE) if args.tiny else (gb.QWEN25_05B, gb.FULL_SHAPE)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    res.put("shape", shape)
    res.put("settings", {"runs": runs, "steps": args.steps, "profile": args.profile, "set": args.set})
    res.put("env", gb.environment())
    if not args.no_ceilings:
        res.put("ceilings", gb.matmul_tflops())
    model_dir = gb.ensure_model(workdir / ("model-tiny" if args.tiny else "model-qwen2.5-0.5b"), arch)
    seed_everything(1)
    tokenizer = load_tokenizer(str(model_dir))
    prompts = gb.make_prompts(shape, arch["vocab_size"])
    micro = args.micro if not args.tiny else 4
    rows = args.steps + (1 if args.profile else 0)

    def config_for(name: str) -> Any:
        kind = RUNS[name]
        overrides = [
            *args.set,
            *kind.overrides,
            f"trainer.v1.trainer_mode={kind.trainer_mode}",
            "checkpoint.export_hf=never",
            "checkpoint.resume=disable",
            f"checkpoint.dir={workdir / 'runs' / name / 'checkpoints'}",
        ]
        return gb.trainer_config(
            workdir,
            model_dir,
            shape,
            "grpo",
            device=device.type,
            micro=micro,
            gpu_memory_utilization=args.gpu_util if not args.tiny else 0.02,
            steps=rows,
            overrides=overrides,
        )

    base_cfg = config_for(runs[0])
    if args.cudagraph_mode:
        limit_cuda_graphs(args.cudagraph_mode)
    gb.log("starting the vLLM engine (rollout.build_engine)")
    engine = build_engine(base_cfg, device)
    res.put("engine", {"start_s": engine.start_seconds})
    gb.log(f"engine started in {engine.start_seconds:.1f} s")
    actor = build_actor(base_cfg, device, 100)
    gen_steps, micro_batches = WINDOWS["tiny" if args.tiny else "full"]
    probe = Probe(out_dir, args.profile, gen_steps, micro_batches)
    actor.update = probe.wrap("update", actor.update)  # type: ignore[method-assign]
    actor.micro_batch_loss = probe.counted("micro_batch", actor.micro_batch_loss)  # type: ignore[method-assign]
    llm_engine = engine._engine().llm_engine
    llm_engine.step = probe.counted("engine_step", llm_engine.step)

    summaries: dict[str, Any] = {}
    for i, name in enumerate(runs):
        key = name if runs.index(name) == i else f"{name}#{runs[: i + 1].count(name)}"
        kind = RUNS[name]
        cfg = config_for(name)
        shutil.rmtree(Path(cfg.checkpoint.dir), ignore_errors=True)
        rollout = gb.colocated(engine, actor, cfg)
        generate = rollout.generate
        if kind.side_stream:
            generate = on_side_stream(generate, device)
        rollout.generate = probe.wrap("gen", generate)  # type: ignore[method-assign]
        roles = Roles(actor=actor, rollout=rollout, reward=build_reward_scorer(cfg.reward, str(device)))
        ppo = PPOTrainer(cfg, roles, tokenizer.decode, tokenizer.pad_token_id, num_gpus=1)
        loader = PromptLoader(prompts, shape["prompts"], shuffle=False, seed=1)
        run = TrainingRun(cfg, ppo, loader, NoCheckpoints())  # type: ignore[arg-type]
        probe.begin_run(key, kind.trainer_mode, rows if args.profile else None)
        gb.log(f"BEGIN {key}: trainer_mode {kind.trainer_mode}, {rows} rows")
        started = time.perf_counter()
        try:
            result = run.fit(progress=False)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            res.error(key, exc)
            res.put(f"{key}_probe", probe.finish())
            continue
        wall = time.perf_counter() - started
        history = result.history
        for row in history:
            t = {k.removeprefix("timing_s/"): round(v, 2) for k, v in row.items() if k.startswith("timing_s/")}
            gb.log(f"{key} row {int(row['step'])}: {row['perf/throughput']:.0f} tok/s/GPU {t}")
        summary = summarize(history, shape, args.steps)
        summary["wall_s"] = wall
        summaries[key] = summary
        res.put(f"{key}_rows", history)
        res.put(f"{key}_probe", probe.finish())
        res.put("summary", summaries)
        gb.log(f"{key} summary: {json.dumps({k: round(v, 3) for k, v in summary.items()})}")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    engine.close()
    res.put("elapsed_s", time.monotonic() - gb.T0)
    print(report(res))
    return 0


def limit_cuda_graphs(mode: str) -> None:
    """Every vLLM engine started after this captures CUDA graphs in `mode` (vLLM's
    CUDAGraphMode: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE; its default on
    Hopper is FULL_AND_PIECEWISE). The trainer has no setting for it (only rollout.enforce_eager,
    which turns graphs and compilation off together), so the bench wraps vllm.LLM, which the
    trainer's engine calls by that name."""
    import functools

    import vllm

    vllm.LLM = functools.partial(vllm.LLM, compilation_config={"cudagraph_mode": mode})
    gb.log(f"vLLM engines capture CUDA graphs in {mode} mode")


# --------------------------------------------------------------------------- report


def report(data: dict[str, Any]) -> str:
    summaries: dict[str, dict[str, float]] = data.get("summary", {})
    lines = [
        f"env: {data.get('env')}",
        f"ceilings: {data.get('ceilings')}",
        "",
        "| run | tokens/s/GPU | step s | gen s | update_actor s | update_weights s | wait_rollout s | wait_trainer s | "
        "gen tokens/s | rows averaged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(s: dict[str, float], key: str) -> str:
        value = s.get(f"timing_s/{key}")
        return f"{value:.2f}" if value is not None else "–"

    for key, s in summaries.items():
        lines.append(
            f"| {key} | {s['perf/throughput']:,.0f} | {cell(s, 'step')} | {cell(s, 'gen')} | {cell(s, 'update_actor')} | "
            f"{cell(s, 'update_weights')} | {cell(s, 'wait_rollout')} | {cell(s, 'wait_trainer')} | "
            f"{s['gen_tokens_per_s']:,.0f} | {int(s['rows_averaged'])} |"
        )
    sync = next((s for k, s in summaries.items() if k.startswith("sync") and "logprobs" not in k), None)
    for key, s in summaries.items():
        if "async" not in key or sync is None:
            continue
        alone = max(sync["timing_s/gen"], sync["timing_s/update_actor"])
        own = max(s["timing_s/gen"], s["timing_s/update_actor"])
        lines.append(
            f"\n{key}: step {s['timing_s/step']:.2f} s against max(gen, update) {alone:.2f} s alone (sync run) "
            f"= {s['timing_s/step'] / alone:.2f}x, {own:.2f} s overlapped = {s['timing_s/step'] / own:.2f}x "
            f"(goal <= 1.10x); tokens/s/GPU {s['perf/throughput'] / sync['perf/throughput']:.2f}x sync (goal >= 1.5x)"
        )
    for key in summaries:
        probe = data.get(f"{key}_probe", {})
        lines.append(f"\n{key}: phases {probe.get('streams')}, gen/update overlap {probe.get('overlap_s', 0):.1f} s")
        for window in probe.get("windows", []):
            kernels = window.get("kernels", {})
            lanes = kernels.get("lanes", {})
            lane_text = ", ".join(f"{lane}: {v['count']} ops, {v['busy_s']:.3f} s busy" for lane, v in lanes.items())
            lines.append(
                f"  window {window['name']} ({window['wall_s']:.2f} s): busy {kernels.get('busy_any_s', 0):.3f} s "
                f"({kernels.get('busy_fraction', 0):.0%}), concurrent {kernels.get('concurrent_s', 0):.3f} s; "
                f"{lane_text}; GIL probe {window.get('gil')}"
                + (f"; error {kernels['error']}" if "error" in kernels else "")
            )
    if data.get("errors"):
        lines.append(f"\nerrors: {json.dumps(data['errors'], indent=1)}")
    return "\n".join(lines)


def trace_bins(path: Path, bin_us: float = 5000.0) -> str:
    """A chrome trace of a profile window (CUDA activity): the two busiest streams in bins of
    `bin_us`, counted as both busy, one busy or neither (busy: over 10 % of the bin), and each
    stream's idle gaps over 1 ms (its host thread not issuing work)."""
    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as f:
        events = [
            e
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        ]
    t0 = min(e["ts"] for e in events)
    bins = int((max(e["ts"] + e["dur"] for e in events) - t0) // bin_us) + 1
    busy: dict[int, list[float]] = defaultdict(lambda: [0.0] * bins)
    for e in events:
        start, end = e["ts"] - t0, e["ts"] - t0 + e["dur"]
        b = int(start // bin_us)
        while start < end and b < bins:
            part = min(end, (b + 1) * bin_us) - start
            busy[e["tid"]][b] += part
            start += part
            b += 1
    counts: dict[int, int] = defaultdict(int)
    for e in events:
        counts[e["tid"]] += 1
    a, b_ = sorted(counts, key=lambda k: -counts[k])[:2]
    on = bin_us * 0.1
    both = sum(1 for i in range(bins) if busy[a][i] > on and busy[b_][i] > on)
    only_a = sum(1 for i in range(bins) if busy[a][i] > on >= busy[b_][i])
    only_b = sum(1 for i in range(bins) if busy[b_][i] > on >= busy[a][i])
    lines = [
        f"{path.name}: {len(events)} device activities over {bins * bin_us / 1e6:.2f} s; "
        f"{bin_us / 1e3:.0f} ms bins: both stream {a} and {b_} busy {both}, only {a} {only_a}, only {b_} {only_b}, "
        f"neither {bins - both - only_a - only_b} (of {bins})"
    ]
    for stream in (a, b_):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == stream)
        gaps = [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(spans) if nxt[0] - cur[1] > 1000]
        lines.append(
            f"  stream {stream}: {len(spans)} activities, {sum(busy[stream]) / 1e6:.3f} s busy; "
            f"{len(gaps)} idle gaps over 1 ms, {sum(gaps) / 1e6:.2f} s in all"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", nargs="?", default="run", choices=["run", "report", "trace"])
    parser.add_argument("paths", nargs="*", type=Path, help="report: the JSON file; trace: chrome traces")
    parser.add_argument("--out", type=Path, default=Path("bench-out/async.json"))
    parser.add_argument("--workdir", default="/tmp/rlkube-bench")
    parser.add_argument("--runs", default="sync,colocate_async", help=f"comma-separated, of: {', '.join(RUNS)}")
    parser.add_argument("--steps", type=int, default=5, help="rows per run (the first is warm-up)")
    parser.add_argument("--profile", action="store_true", help="one more row per run, profiled (not averaged)")
    parser.add_argument("--micro", type=int, default=16, help="ppo_micro_batch_size_per_gpu")
    parser.add_argument("--gpu-util", type=float, default=0.25, help="vLLM gpu_memory_utilization")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shape on CPU (smoke test)")
    parser.add_argument("--no-ceilings", action="store_true", help="skip the matmul / copy ceilings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer-config setting")
    parser.add_argument(
        "--cudagraph-mode",
        default="",
        help="vLLM's cudagraph_mode for the engine (PIECEWISE, NONE, ...); default vLLM's",
    )
    args = parser.parse_args(argv)
    if args.phase == "report":
        for path in args.paths:
            print(report(json.loads(path.read_text())))
        return 0
    if args.phase == "trace":
        for path in args.paths:
            print(trace_bins(path))
        return 0
    gb.log(f"async_bench: {vars(args)}")
    gb.trainer_on_pythonpath()
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
