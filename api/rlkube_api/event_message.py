"""An Event's message within the API server's limit, which both the operator and the trainer
post: a longer one is refused (422) and the Event is lost with it."""

from __future__ import annotations

# core/v1 Event.message (and events.k8s.io's note): at most this many bytes.
EVENT_MESSAGE_LIMIT = 1024
# How much of a message's start is kept when it is cut: it names what failed (the pod, the
# role); the rest goes to its end, where the error itself is (a traceback's last line).
HEAD_BYTES = 320
CUT = " … "


def fit_event_message(message: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """`message` unchanged if it fits in `limit` UTF-8 bytes; else its start and its end
    around a mark, within the limit and never splitting a character."""
    data = message.encode()
    if len(data) <= limit:
        return message
    tail_bytes = limit - HEAD_BYTES - len(CUT.encode())
    head = data[:HEAD_BYTES].decode(errors="ignore")
    tail = data[-tail_bytes:].decode(errors="ignore")
    return head + CUT + tail
