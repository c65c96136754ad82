"""The process: stop signals, DDP process groups, secrets and the project's .env."""

import os


def running(pid: int) -> bool:
    """Whether process ``pid`` of this machine is alive (another user's counts: it cannot be asked, only seen)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
