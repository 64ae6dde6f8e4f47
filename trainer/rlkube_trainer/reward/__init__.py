"""Rewards: a user's reward function (verl's `compute_score` signature) or a reward model,
scored over a batch of rollouts."""
