"""PostgreSQL's backend: the store in a schema of a PostgreSQL database, on pooled connections each held
for one call or one transaction.

Only :mod:`.connection` imports the driver (psycopg, ``sift[postgres]``); it is imported when a PostgreSQL
store is opened, so ``import sift.dcache`` adds no driver of its own.
"""
