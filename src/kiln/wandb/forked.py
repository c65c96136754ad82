"""A process forked from one that has imported W&B: W&B's import-time temporary folders belong to the parent."""

from __future__ import annotations

import atexit


def leave_temporary_folders_to_parent() -> None:
    """W&B makes two temporary folders as it is imported and removes them as the process ends. Forked children share
    the parent's: the first child to end removed them under every other's files (a later run's W&B stopped at its
    first picture). A child calls this once after the fork; the parent removes them as it ends
    (docs/development.md, private APIs: the folders' names and ``TemporaryDirectory._finalizer``)."""
    from wandb.sdk.artifacts.artifact import Artifact
    from wandb.sdk.data_types import _private

    for folder in (_private.MEDIA_TMP, Artifact._TMP_DIR):
        atexit.unregister(folder.cleanup)
        folder._finalizer.detach()  # type: ignore[attr-defined]
