"""Read every page of a gallery's LMDB tables in a child process, so that a damaged page LMDB aborts or faults on
(an assertion, SIGBUS, SIGSEGV) ends the child, not the command: `lmdb_store.walk_in_child` runs this file as

    python -I -S lmdb_walk.py SITE LMDB_DIR NAME...

(SITE: the folder lmdb is imported from; nothing of metricsearch is imported). It walks each named table with a
cursor, which reads every branch and leaf page and each node's header, and reads the first and last byte of every
key and value (a node's sizes, and the first and last page of a large value). It prints each table's name before
walking it; exits 0 when all is read, DAMAGED with LMDB's error on the last line when LMDB reports the damage."""

import sys

DAMAGED = 3


def walk(path: str, names: list[str]) -> None:
    """Read every key and value of the tables `names` of the LMDB environment at `path` (absent ones skipped)."""
    import lmdb

    env = lmdb.open(path, max_dbs=len(names) + 2, readonly=True, readahead=False)
    try:
        for name in names:
            try:
                db = env.open_db(name.encode(), create=False)
            except lmdb.NotFoundError:  # a build stopped before creating it, or a table added since
                continue
            print(name, flush=True)
            with env.begin(db=db, buffers=True) as txn:
                for key, value in txn.cursor():  # a byte read through the map faults here, not in the command
                    key[0], key[-1]  # noqa: B018
                    if len(value):
                        value[0], value[-1]  # noqa: B018 -- the first and last page of a large value
    finally:
        env.close()


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import lmdb

    try:
        walk(sys.argv[2], sys.argv[3:])
    except lmdb.Error as exc:  # LMDB's own report of a damaged page, for the caller's one line
        print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, flush=True)
        sys.exit(DAMAGED)
