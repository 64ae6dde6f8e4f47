"""rlkube_operator: the RLJob controller (kopf wiring in handlers.py, decisions in status/,
their execution in reconcile.py, pure child builders in children/, gang plugins in gang/)."""
