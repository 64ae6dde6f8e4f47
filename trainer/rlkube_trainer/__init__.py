"""rlkube_trainer."""
