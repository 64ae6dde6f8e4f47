"""What each role computes on one rank: the actor scores and updates the policy, the
critic estimates and updates values, the reference scores. `training.py` holds what
actor and critic share: the optimizer, its schedule and PPO's mini/micro-batch loop."""
