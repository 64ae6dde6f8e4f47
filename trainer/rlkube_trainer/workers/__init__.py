"""What runs on each rank: a Rank holds its roles (actor, critic, reference, rollout engine,
reward model), trains them, checks they fit in memory, reshards and syncs the actor's weights
into the rollout engines, and saves and loads its share of a checkpoint."""
