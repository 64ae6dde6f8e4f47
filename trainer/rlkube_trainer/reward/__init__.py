"""Rewards: a user's reward function (verl's `compute_score` signature) in worker processes
(`pool.py`) or the driver's own, a remote verifier over HTTP (`remote.py`), or a reward model
(`scoring.py`), scored over a batch of rollouts."""
