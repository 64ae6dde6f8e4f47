"""rlkube_operator."""
