"""A GSM8K reward of your own, as a starting point (examples/gpu-multipool.yaml mounts it from
a ConfigMap). Without reward.function rlkube scores openai/gsm8k rows with its built-in scorer
(1.0 right, 0.0 otherwise); this one also gives a small reward to a well-formed wrong answer,
verl's `format_score`, which helps a model that has not yet learnt the `#### <answer>` line.

verl's signature: compute_score(data_source, solution_str, ground_truth, extra_info=None).
Self-contained on purpose: the file is all the pods get.
"""

from __future__ import annotations

import re
from typing import Any

FORMAT_SCORE = 0.1
# Only the end of a response is searched: the answer line is last.
_TAIL_CHARS = 300
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    found = _ANSWER.findall(solution_str[-_TAIL_CHARS:])
    if not found:
        return 0.0
    answer = str(found[-1]).replace(",", "").replace("$", "")
    return 1.0 if answer == str(ground_truth).replace(",", "") else FORMAT_SCORE
