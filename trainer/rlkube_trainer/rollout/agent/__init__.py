"""Agentic multi-turn rollouts: tools, sandbox, trajectories. User code imports `rlkube_trainer.tools`."""
