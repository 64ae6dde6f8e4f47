"""Reward of the tiny CPU task: the prompt is a few random digits, and the answer
is the first of them. Reading the prompt is the only way to score: a constant
answer is right one time in ten.

verl's signature: compute_score(data_source, solution_str, ground_truth, extra_info=None).
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    words = solution_str.split()
    return 1.0 if words and words[0] == str(ground_truth) else 0.0
