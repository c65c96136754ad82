"""Errors a user can fix: the CLI prints them as one line and exits non-zero, without a traceback."""


class KilnError(Exception):
    """A problem with the user's input (data, config, checkpoint) whose message says what to do."""

    exit_code = 1


class UsageError(KilnError):
    """Settings that do not parse (an unknown key, a wrong type, a missing class); exits 2, as argparse does."""

    exit_code = 2


class MissingDataError(KilnError, FileNotFoundError):
    """Dataset files are absent and could not be downloaded."""


class HealthCheckError(KilnError):
    """A batch or a training step failed a health check; the message names the batch, field and values."""


class DeviceMemoryError(KilnError):
    """A dataset asked to live on the device does not fit in its free memory."""


class ConfigError(KilnError, ValueError):
    """Settings that cannot work together; the message names them and the fix."""


class DataError(KilnError):
    """A dataset that cannot be trained or evaluated on as configured (an empty split, say)."""
