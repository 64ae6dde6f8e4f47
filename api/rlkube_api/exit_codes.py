"""The trainer's exit codes, read by the operator's failure policy. Defined once here:
the trainer exits with them, the operator's default rules classify them.

CONFIG is permanent: a configuration or data error the trainer found (a model path with no
model, a data file that does not exist, a reward function that does not import, a prompt
length beyond the model's positions). Running the job again cannot fix it, so the operator
fails the job at once with the trainer's message instead of restarting the gang. 78 is
sysexits.h's EX_CONFIG, outside the codes Python (1), argparse (2) and signals (128+n) use.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # A rank's process died: the gang restarts from its last checkpoint.
    RANK_LOST = 3
    # Role pods did not join the driver's Ray head in time.
    NODES_MISSING = 4
    # The configuration or data cannot work (permanent: the job fails at once).
    CONFIG = 78


# Where a container writes its termination message (Kubernetes' default
# terminationMessagePath): the kubelet puts it into the container's terminated state, which
# the operator copies into the Failed condition and the Event.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The kubelet keeps at most this many bytes of it.
TERMINATION_MESSAGE_LIMIT = 4096
