"""Checkpoints: the folder protocol (manager), built from durable writes (durable), the folder's
layout and completeness (folder), the writers' reports and checksums (integrity) and what is kept
(retention); what ranks and the driver write (state), and the Hugging Face export of the final
actor (export)."""
