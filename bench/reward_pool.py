"""Reward scoring in the driver: one row after another (reward.numWorkers 0) against the pool of
worker processes (reward/pool.py), and a remote verifier's concurrent requests (reward/remote.py).

    .venv/bin/python bench/reward_pool.py [--rows 512] [--seconds 0.05] [--out bench/results/reward_pool]

Scenarios, each over the same rows:
- cpu: a verifier that computes for `seconds` a row (a busy loop): bounded by the cores.
- io: a verifier that waits `seconds` a row (time.sleep, as a call to a service would):
  bounded by the workers, which may outnumber the cores.
- remote: an HTTP endpoint on 127.0.0.1 answering after `seconds`, maxConcurrent requests.
Each pool is warmed on a few rows first (its processes started, the file imported), as it is
after a training run's first step; the timed call is a whole batch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rlkube_api.config import RewardConfig
from rlkube_trainer.reward.scoring import FunctionRewardScorer, RewardInput, build_reward_scorer

FUNCTIONS = """
import time

SECONDS = {seconds}


def busy(data_source, solution_str, ground_truth, extra_info=None):
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end:
        pass
    return float(solution_str == ground_truth)


def waiting(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(SECONDS)
    return float(solution_str == ground_truth)
"""


class SlowVerifier(BaseHTTPRequestHandler):
    seconds = 0.05

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.seconds)
        answer = json.dumps({"score": float(body["solution_str"] == body["ground_truth"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class VerifierServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a listen backlog above the concurrency: no connection is refused


def timed(scorer: Any, batch: list[RewardInput]) -> float:
    scorer.score(batch[:8])  # warm: processes started, the file imported
    start = time.perf_counter()
    scores = scorer.score(batch).scores
    seconds = time.perf_counter() - start
    assert scores == [float(r.solution_str == r.ground_truth) for r in batch]
    if isinstance(scorer, FunctionRewardScorer):
        scorer.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=0.05, help="each row's time in the verifier")
    parser.add_argument("--io-workers", type=int, default=16, help="pool size for the waiting verifier")
    parser.add_argument("--concurrency", type=int, default=32, help="the remote verifier's maxConcurrent")
    parser.add_argument("--out", type=Path, default=None, help="folder for result.json")
    args = parser.parse_args()
    batch = [RewardInput("bench", str(i % 2), "1") for i in range(args.rows)]
    cpus = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "verifiers.py"
        path.write_text(FUNCTIONS.format(seconds=args.seconds))

        def function(name: str, workers: int) -> Callable[[], Any]:
            config = {"function": {"path": str(path), "name": name}, "numWorkers": workers}
            return lambda: build_reward_scorer(RewardConfig.model_validate(config))

        runs = [
            ("cpu", "serial, in the driver (numWorkers 0)", function("busy", 0)),
            ("cpu", f"pool, {cpus} workers (numWorkers unset: the CPUs)", function("busy", cpus)),
            ("io", "serial, in the driver (numWorkers 0)", function("waiting", 0)),
            ("io", f"pool, {args.io_workers} workers", function("waiting", args.io_workers)),
        ]
        for scenario, how, build in runs:
            seconds = timed(build(), batch)
            results.append({"scenario": scenario, "how": how, "seconds": round(seconds, 3)})
            print(f"{scenario:6} {how:50} {seconds:7.2f} s", flush=True)

    SlowVerifier.seconds = args.seconds
    server = VerifierServer(("127.0.0.1", 0), SlowVerifier)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    os.environ["no_proxy"] = "127.0.0.1"
    for concurrency in (1, args.concurrency):
        remote = {"url": url, "maxConcurrent": concurrency}
        how = f"remote verifier, maxConcurrent {concurrency}"
        seconds = timed(build_reward_scorer(RewardConfig.model_validate({"remote": remote})), batch)
        results.append({"scenario": "remote", "how": how, "seconds": round(seconds, 3)})
        print(f"{'remote':6} {how:50} {seconds:7.2f} s", flush=True)
    server.shutdown()

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        report = {
            "rows": args.rows,
            "seconds_per_row": args.seconds,
            "cpus": cpus,
            "cpu_model": platform.processor() or platform.machine(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "results": results,
        }
        (args.out / "result.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
