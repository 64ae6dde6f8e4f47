"""Checkpoints: the folder protocol (store), what ranks and the driver write (state),
and the Hugging Face export of the final actor (export)."""
