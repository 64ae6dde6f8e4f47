"""Cost of parsing an RLJob as the operator does each reconcile pass: with the CEL rules
evaluated in Python (`parse_rljob(obj)`) and as an admitted object (`admitted=True`).

    .venv/bin/python bench/parse_rljob.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "api"))

from rlkube_api.validation import parse_rljob  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    job = yaml.safe_load((ROOT / "examples" / "gpu-multipool.yaml").read_text())
    job["metadata"].update(namespace="default", uid="u", resourceVersion="1", generation=1)
    for admitted in (False, True):
        parse_rljob(job, admitted=admitted)  # warm-up (CEL programs compile once)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            parse_rljob(job, admitted=admitted)
            times.append(time.perf_counter() - start)
        label = "admitted (CEL skipped)" if admitted else "full (CEL in Python)"
        print(f"{label}: median {statistics.median(times) * 1e3:.2f} ms over {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
