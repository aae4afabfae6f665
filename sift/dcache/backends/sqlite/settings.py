"""The SQLite store's connection settings: the pragmas and their timeouts."""

from __future__ import annotations

__all__ = [
    "BUSY_TIMEOUT_S",
    "CHECKPOINT_LINGER_S",
    "CHECKPOINT_RETRY_S",
    "CHECKPOINT_WAIT_S",
    "CLAIMS_NEED_SQLITE",
    "PRAGMAS",
    "READONLY_PRAGMAS",
    "SYNCHRONOUS_DURABLE",
    "WAL_AUTOCHECKPOINT_PAGES",
    "WAL_RESTART_FRAMES",
]

#: Pages of -wal file after which a COMMIT checkpoints (SQLite's default), except in bulk writes.
WAL_AUTOCHECKPOINT_PAGES = 1000
#: Frames of -wal file from which a queued store's checkpoint runs with the lock and the writers' queue held,
#: so that no write comes in between and the file starts again from its beginning (16 MiB of 4 KiB pages).
WAL_RESTART_FRAMES = 4 * WAL_AUTOCHECKPOINT_PAGES
#: The most that checkpoint, made with every writer held, waits for another process's checkpoint to end (a
#: quarter of the busy timeout when that is shorter): other processes' writers wait on the queue meanwhile.
CHECKPOINT_WAIT_S = 0.25
#: How long it sleeps between its tries.
CHECKPOINT_RETRY_S = 0.005
#: How long the checkpoint's thread aside waits for a write's ask after a checkpoint that a reader's older
#: snapshot kept from copying anything, before it ends: while that reader reads, each write asks again.
CHECKPOINT_LINGER_S = 0.25

#: The oldest SQLite whose library can run claim_batch_targets.
CLAIMS_NEED_SQLITE = (3, 35, 0)
#: The busy timeout: how long a write waits for another process's write lock before failing.
BUSY_TIMEOUT_S = 10.0

#: ``synchronous`` of a store opened with ``open_db(path, durable=True)``: WAL frames are synced at every
#: COMMIT, so a commit that returned survives a power loss (an fsync per commit).
SYNCHRONOUS_DURABLE = "full"

#: Connection pragmas, applied on every connect.
PRAGMAS: dict[str, object] = {
    # Readers never block the writer and vice versa; two processes can share the file.
    "journal_mode": "wal",
    # In WAL mode, commits survive a process kill; a power loss may drop the last transactions,
    # never corrupt the file.
    "synchronous": "normal",
    # Milliseconds a statement waits on another process's lock (BEGIN IMMEDIATE uses it too).
    "busy_timeout": int(BUSY_TIMEOUT_S * 1000),
    # Truncate the -wal file back to 64 MiB after each checkpoint, so one big sweep cannot leave it huge.
    "journal_size_limit": 64 * 1024 * 1024,
    # SQLite's default: a COMMIT that takes the -wal file past this many pages checkpoints it.
    "wal_autocheckpoint": WAL_AUTOCHECKPOINT_PAGES,
    # 32 MiB of page cache: the hot indexes of a large store stay in memory.
    "cache_size": -32 * 1024,
    # An INSERT OR REPLACE deletes the row it replaces; only with this on does that delete fire the
    # trigger that keeps batch_totals right.
    "recursive_triggers": 1,
    # The schema has no foreign keys; keep SQLite from checking any another program may add.
    "foreign_keys": 0,
}

#: What a read-only store sets: nothing that writes the file (``journal_mode`` is the file's own), and
#: ``query_only`` so that even an ad-hoc write through the connection is refused.
READONLY_PRAGMAS: dict[str, object] = {
    **{
        k: v
        for k, v in PRAGMAS.items()
        if k not in ("journal_mode", "wal_autocheckpoint", "journal_size_limit")
    },
    "query_only": 1,
}
