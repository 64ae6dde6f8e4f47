"""An OpenAI-compatible endpoint on the rollout engine, for agent harnesses that are programs of
their own: every call's exact token ids and log-probs are recorded per episode (recorder.py),
served over HTTP (server.py) to harness processes the trainer starts (harness.py)."""
