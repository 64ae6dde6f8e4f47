"""rlkube_api."""
