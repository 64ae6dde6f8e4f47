"""The driver's handle on the ranks: role rank groups (Ray actors, or in-process ranks), the
calls dispatched to them with their results gathered, and the elastic rollout fleet. Runs in the
driver; what runs on each rank is in `workers`."""
