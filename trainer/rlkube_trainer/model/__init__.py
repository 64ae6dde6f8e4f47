"""The model a rank trains, independent of its role: loading Hugging Face models, the critic's
value head, log-probs from logits, sequence packing, FSDP2 sharding and LoRA adapters."""
