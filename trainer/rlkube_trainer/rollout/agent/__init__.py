"""Agentic multi-turn rollouts (issue 30): tools, sandbox, trajectories."""
