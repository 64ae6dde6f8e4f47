"""Will a job fit its GPUs? The memory per rank of each role in its parallel layout, from the
model's dimensions (model.py) and the job (estimate.py), and the docs' memory table (table.py)."""
