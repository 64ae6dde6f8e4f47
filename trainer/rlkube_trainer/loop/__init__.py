"""The driver's loop, in the controller pod: the PPO step (generate, score, advantages, update,
sync weights), the run around it (resume, save, validate, stop on SIGTERM), the asynchronous
schedules, and what the run reports (metrics, progress, Prometheus, trackers)."""
