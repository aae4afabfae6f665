"""The writers' queue of a SQLite store: an OS file lock that processes take before ``BEGIN IMMEDIATE``.

SQLite's busy handler does not queue: a writer that finds the file locked sleeps 1, 2, 5, 10, ... up to
100 ms between tries, while the process holding the lock commits and begins again at once, so the unlucky
writers of several processes wait hundreds of milliseconds. Here a write transaction first takes an
exclusive ``flock`` on ``<store>-lock``, and holds it until its COMMIT or ROLLBACK: waiting writers sleep
in the kernel and wake the moment it is released. SQLite's own locks stay the truth; the queue only orders
sift's writers.

- **Around the whole transaction**, not only its ``BEGIN IMMEDIATE``: a writer that held the queue only
  while taking SQLite's lock would then sleep in the busy handler behind the transaction before it,
  leaving the file idle.
- **A file of its own**, ``<store>-lock``, never the store file: a process's ``fcntl`` locks on the store
  file vanish when any descriptor of it is closed, which would drop SQLite's own locks; on NFS ``flock``
  is emulated with such locks. The file holds no data: deleting it while nobody writes is harmless.
- **flock**, not ``fcntl``: the lock belongs to the open file, so a thread of the process can wait for
  it on another's behalf (below), and the command-line ``flock(1)`` or Go's ``syscall.Flock`` can join
  the queue. The kernel releases it when the process dies, SIGKILL included.
- **Bounded wait**: ``flock`` cannot time out, so after a first non-blocking try a helper thread of the
  process blocks in it while the writer waits up to the store's ``timeout``; past it the writer raises
  StoreUnavailable ("locked by another process"), as SQLite's busy timeout does, and the helper drops the
  lock if it gets it later; so it does when the wait ends in an exception (a KeyboardInterrupt, a signal
  handler's), leaving no lock and no turn behind. A writer thus waits at most ``timeout`` for the queue,
  then at most ``timeout`` for SQLite's lock, which only a writer outside the queue holds.
- **Only write transactions**: a read-only store, an in-memory store, reads and deferred ``BEGIN`` never
  take it. Inside one process the store's RLock already serializes threads, so one thread at a time waits
  here.
- **Files**: created on the first write with the store file's mode (0600 for a store sift made), owned
  by the store file's owner when root creates it, as SQLite does for ``-wal``; after a ``chmod`` of the
  store, its owner's next ``open_db`` and write give the lock file the same mode. It is opened read-only
  (``flock`` needs no more), without blocking (a FIFO's open would wait for a writer), and never through a
  symlink (``O_NOFOLLOW``): whoever can write the store's directory cannot point it at another file. Its
  mode is changed only on a regular, empty file with one name, owned by the store file's owner. If it
  cannot be opened (a directory this user may not write, a symlink, say), or is not a regular file, the
  store works as before: on SQLite's busy handler alone.
- **No hand-over**: a writer that releases the lock may take it again at once (its next call tries
  without blocking first), as under the busy handler. Yielding the CPU after each release, spinning before
  blocking, or keeping the lock for the process's next write each cost throughput for little gain in the
  tail; handing the file over after every transaction costs throughput on an idle machine.
- **fork**: the child closes the descriptor it inherited (closing does not release the parent's lock)
  and opens its own; a child thus never holds its parent's lock after the parent ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading

from ...errors import StoreUnavailable

__all__ = ["LOCK_SUFFIX", "WriterQueue"]

#: The lock file's name is the store file's with this appended.
LOCK_SUFFIX = "-lock"


class WriterQueue:
    """The queue of one store file. Callers hold the store's RLock around ``acquire`` … ``release``."""

    def __init__(self, store_path: str | None, timeout: float) -> None:
        #: ``<store>-lock``, or None: no queue (an in-memory or read-only store).
        self.path = None if store_path is None else store_path + LOCK_SUFFIX
        self.store_path = store_path
        self.timeout = timeout
        #: Whether this process holds the lock for a transaction of its own.
        self.held = False
        self._fd: int | None = None
        self._unusable = False  # the lock file could not be opened: no queue
        self._mutex = threading.Lock()
        self._wake = threading.Semaphore(0)
        self._granted = threading.Semaphore(0)
        self._want = False  # a writer waits for the helper's grant
        self._helper_waits = False  # the helper is blocked in flock (or about to be)
        self._helper: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, waiting up to ``timeout`` seconds; raise StoreUnavailable past it."""
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:
            return
        try:
            with self._mutex:
                if not self._helper_waits:  # else the helper's pending flock is this writer's turn
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        pass
                    else:
                        self.held = True
                        return
                    self._helper_waits = True
                    self._start_helper()
                    self._wake.release()
                self._want = True
            if self._granted.acquire(timeout=self.timeout):
                self.held = True
                return
            with self._mutex:
                if not self._want:  # granted between the timeout and here
                    self._granted.acquire()
                    self.held = True
                    return
                self._want = False
        except BaseException:  # interrupted: a KeyboardInterrupt, an exception from a signal handler
            self._give_up(fd)
            raise
        raise StoreUnavailable(
            f"database: locked by another process for over {self.timeout:g} s "
            f"(queued for {self.path!r} behind another writer)"
        )

    def _give_up(self, fd: int) -> None:
        """Leave the queue after an exception in ``acquire``, wherever it struck: this process keeps no
        lock, no pending wish for one, and no grant a later writer could take without the lock."""
        with self._mutex:
            self._want = False  # the helper, still blocked in flock, drops the lock when it gets it
            self._granted.acquire(blocking=False)  # a grant given, and not yet taken
            self.held = False
            if self._fd == fd:  # the lock, if it was taken or granted; else this unlocks nothing
                fcntl.flock(fd, fcntl.LOCK_UN)

    def release(self) -> None:
        """Release the lock, if this process holds it."""
        if self.held:
            self.held = False
            assert self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Release the lock and close the file (the store is closing); the helper ends. A helper still
        blocked in flock closes the file itself when flock returns."""
        self.release()
        with self._mutex:
            fd, self._fd = self._fd, None
            self._want = False
            self.path = None
            if fd is not None and not self._helper_waits:
                os.close(fd)
            if self._helper is not None and not self._helper_waits:
                self._wake.release()  # it sees no file, and ends

    def after_fork_in_child(self) -> None:
        """In a forked child: forget the parent's descriptor and helper; open a new one on first use."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # shares the parent's open file: closing it keeps the parent's lock
        self._fd = None
        self.held = False
        self._mutex = threading.Lock()
        self._wake = threading.Semaphore(0)
        self._granted = threading.Semaphore(0)
        self._want = self._helper_waits = False
        self._helper = None

    def _open(self) -> int | None:
        if self._fd is not None or self.path is None or self._unusable:
            return self._fd
        assert self.store_path is not None
        try:
            info = os.stat(self.store_path)
            mode = stat.S_IMODE(info.st_mode) & 0o666
            safe = os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW  # never a file a symlink points to
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | safe, mode)
                created = True
            except FileExistsError:
                # flock needs no write access; O_NONBLOCK: opening a FIFO would wait for its writer.
                fd = os.open(self.path, os.O_RDONLY | safe)
                created = False
        except OSError:
            self._unusable = True
            return None
        try:
            usable = self._match_store(fd, info, mode, created)
        except OSError:
            usable = False
        if not usable:
            self._unusable = True
            os.close(fd)
            return None
        self._fd = fd
        return fd

    @staticmethod
    def _match_store(fd: int, info: os.stat_result, mode: int, created: bool) -> bool:
        """Give the lock file the store file's mode (and, made by root, its owner). False if the file found
        at its path is not a regular file; one that is not the store owner's own keeps its mode. An
        OSError of fchmod or fchown propagates."""
        if created:
            os.fchmod(fd, mode)  # the umask may have taken bits away
            if os.geteuid() == 0:
                os.fchown(fd, info.st_uid, info.st_gid)
            return True
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):  # a directory, a FIFO, …: not ours to chmod
            return False
        # Only the store owner's own lock file follows the store's mode: never a file of someone else's,
        # nor one with data or another name (a hard link to a private file planted beside the store).
        own = found.st_uid == info.st_uid == os.geteuid() and found.st_nlink == 1 and found.st_size == 0
        if own and stat.S_IMODE(found.st_mode) != mode:
            os.fchmod(fd, mode)  # the store's mode was changed (chmod 0660 to share it): the lock follows
        return True

    def _start_helper(self) -> None:
        if self._helper is None:
            self._helper = threading.Thread(target=self._wait_for_turns, name="sift-writers", daemon=True)
            self._helper.start()

    def _wait_for_turns(self) -> None:
        """The helper: blocks in flock for a waiting writer, hands the lock over, or drops it if the writer
        has given up (or the store was closed) meanwhile."""
        while True:
            self._wake.acquire()
            fd = self._fd
            if fd is None:
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self._mutex:
                self._helper_waits = False
                if self._want and self._fd == fd:
                    self._want = False
                    self._granted.release()
                    continue
                fcntl.flock(fd, fcntl.LOCK_UN)
                if self._fd != fd:  # closed while it waited
                    os.close(fd)
                    return
