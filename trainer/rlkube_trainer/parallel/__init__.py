"""Model parallelism beyond FSDP2 for the training roles, PyTorch-native: one device mesh per
role (`mesh.py`) laid out from its RLJob fields (`layout.py`), DTensor tensor parallel plans for
the decoder layers (`tensor.py`), Ulysses sequence parallel around attention (`sequence.py`) and
pipeline stages (`pipeline.py`)."""
