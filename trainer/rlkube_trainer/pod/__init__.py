"""The pod's own process: the `rlkube-trainer` command, the checks before anything waits on
anything, this pod's Ray node, the health endpoint, and how the process exits (its code, its
termination message, its Event). Everything here runs in the container's main process."""
