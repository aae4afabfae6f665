"""PostgreSQL's backend: the store in a schema of a PostgreSQL database, a pooled connection per thread.

Only :mod:`.connection` imports the driver (psycopg, ``sift[postgres]``); it is imported when a PostgreSQL
store is opened, so ``import sift.dcache`` adds no driver of its own.
"""
