"""The rlkube trainer: verl's PPO-family algorithms on Ray, with vLLM rollout and FSDP2 training.

Its packages say which process a line runs in: `pod` (the container's entry), `loop` (the
driver), `cluster` (the driver's handle on rank groups), `workers` (each rank), and below them
what both sides use: `model`, `rollout`, `reward`, `checkpoint`, `data`, `algos`, `scorers`.
`batch` is the training batch that crosses from the driver to the ranks."""
