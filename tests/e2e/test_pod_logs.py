"""How the e2e tests' log follower merges what it reads: no cluster, no pod (`PodLogs`
itself follows the drivers of test_faults and test_tiny_job)."""

from __future__ import annotations

from tests.e2e.real_node_kit import log_text, merge_log_lines

FIRST = "2026-12-04T20:47:44.031257329Z resumed from step_000012 (step 12)"
# The kubelet drops the trailing zeros of a timestamp's nanoseconds: 44.1 sorts after 44.03.
SECOND = "2026-12-04T20:47:44.1Z step 13"
THIRD = "2026-12-04T20:47:44.99Z step 14"


def test_lines_split_across_chunks_are_kept_whole_and_the_partial_tail_waits() -> None:
    seen: dict[str, None] = {}
    tail = merge_log_lines(seen, FIRST[:30])
    assert seen == {} and tail == FIRST[:30]
    tail = merge_log_lines(seen, tail + FIRST[30:] + "\n" + SECOND[:10])
    assert list(seen) == [FIRST] and tail == SECOND[:10]


def test_a_log_read_again_from_its_start_adds_only_its_new_lines() -> None:
    seen: dict[str, None] = {}
    merge_log_lines(seen, f"{FIRST}\n{SECOND}\n")
    merge_log_lines(seen, f"{FIRST}\n{SECOND}\n{THIRD}\n")
    assert log_text(seen) == "resumed from step_000012 (step 12)\nstep 13\nstep 14\n"


def test_lines_come_out_in_the_kubelets_time_order_whatever_order_they_were_read_in() -> None:
    seen: dict[str, None] = {}
    merge_log_lines(seen, f"{THIRD}\n")  # a later incarnation's stream read first
    merge_log_lines(seen, f"{SECOND}\n{FIRST}\n")
    assert log_text(seen).splitlines() == [
        "resumed from step_000012 (step 12)",
        "step 13",
        "step 14",
    ]
