"""The error a user can cause and fix (missing binary, bad pools file, port in use)."""


class ClusterError(Exception):
    """A problem worth one line to the user rather than a traceback.

    The CLI prints `str(error)` and exits 1; the pytest fixture fails with it.
    """
