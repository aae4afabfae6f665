"""Files sift creates: private to their owner, and durable once renamed into place."""

from __future__ import annotations

import os

from .errors import InvalidBatchInput

__all__ = ["PRIVATE_MODE", "create_private", "fsync_directory", "path_argument"]

#: The mode of every file sift creates: read and write for the owner only.
PRIVATE_MODE = 0o600


def create_private(path: str) -> bool:
    """Create ``path`` empty with mode 0600 if it does not exist; return whether it was created.

    An existing file keeps its mode, and a symlink at ``path`` is never followed. A failure to create is
    left to SQLite, which opens the file next and reports why it cannot.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE_MODE)
    except OSError:
        return False
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask may have taken bits away from the owner too
    finally:
        os.close(fd)
    return True


def fsync_directory(path: str) -> None:
    """Make a rename or a new file in the directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def path_argument(field: str, value: str | os.PathLike[str]) -> tuple[str, str]:
    """The path argument ``field`` as given and made absolute; anything but a non-empty path is refused."""
    try:
        shown = os.fspath(value)
    except TypeError:
        shown = None
    if not isinstance(shown, str) or not shown:
        raise InvalidBatchInput(field, f"must be a non-empty str or os.PathLike of str, got {value!r}")
    return shown, os.path.abspath(shown)
