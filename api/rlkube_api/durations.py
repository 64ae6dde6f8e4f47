"""Durations as `kubectl get` prints them (its AGE column's style), for columns of our own."""

from __future__ import annotations

import math


def short_duration(seconds: float) -> str:
    """Two units at most, as kubectl's ages read: 45s, 3m20s, 2h5m, 3d4h; 0s for none left."""
    total = max(0, math.ceil(seconds)) if math.isfinite(seconds) else 0
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"
