"""The Hypothesis example database behind ``--fp4-db`` / ``FP4_DB``: a local directory or a shared Redis.

``SPEC`` is either a directory path or ``redis://HOST:PORT/DB`` (also ``rediss://``):

* a directory: Hypothesis's ``DirectoryBasedExampleDatabase`` there;
* a Redis URL: Hypothesis's own ``RedisExampleDatabase`` (the ``hypothesis[redis]`` extra) on
  that server, combined by ``MultiplexedDatabase`` with the local directory database, so a
  failure found on any host of a fleet is replayed by every other host and by whoever triages
  it, while each host keeps its own replays when the server is gone;
* ``readonly=True`` wraps the shared part in ``ReadOnlyDatabase``: pre-merge runs replay the
  nightly failures without writing theirs (the local directory stays writable).

Every problem is a :class:`DatabaseError` raised before the first test: a path that is a file
or cannot be written, a URL that does not parse, a missing ``redis`` package, a server that
does not answer ``PING``. Nothing falls back silently.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

DEFAULT_LOCAL = ".hypothesis/fp4-nightly"
REDIS_SCHEMES = ("redis", "rediss")


class DatabaseError(ValueError):
    """``--fp4-db`` names a database that cannot be used."""


def is_redis(spec: str) -> bool:
    return urlparse(spec).scheme in REDIS_SCHEMES


def directory_database(path: str | os.PathLike[str]) -> DirectoryBasedExampleDatabase:
    """A directory database at ``path``, after checking that a file can be created there."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise DatabaseError(f"example database {str(folder)!r} is a file, not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fp4-write-check-"):
            pass
    except OSError as exc:
        raise DatabaseError(f"example database {str(folder)!r} is not writable: {exc.strerror or exc}") from None
    return DirectoryBasedExampleDatabase(str(folder))


def redis_database(url: str, *, timeout_s: float = 5.0):
    """Hypothesis's ``RedisExampleDatabase`` on the server at ``url``, after a ``PING``."""
    parsed = urlparse(url)
    if parsed.scheme not in REDIS_SCHEMES or not parsed.hostname:
        raise DatabaseError(f"{url!r} is not a Redis URL (redis://HOST:PORT/DB)")
    try:  # redis-py parses the URL itself; these raise ValueError for a bad port or database number
        _ = parsed.port
        _ = int(parsed.path.lstrip("/") or 0)
    except ValueError:
        raise DatabaseError(f"{url!r}: the port and the database number must be integers") from None
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise DatabaseError(
            f"--fp4-db {url} needs the redis client: pip install 'hypothesis[redis]' (or fp4-conformance[fleet])"
        ) from None
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise DatabaseError(f"Redis example database {url} does not answer: {exc}") from None
    return RedisExampleDatabase(client)


def open_database(spec: str | None, *, readonly: bool = False, local: str = DEFAULT_LOCAL) -> ExampleDatabase:
    """The example database for ``spec`` (None: the local directory ``local``); see the module doc."""
    if spec is None or not is_redis(spec):
        if readonly:
            raise DatabaseError("--fp4-db-readonly needs a shared database: --fp4-db redis://HOST:PORT/DB")
        return directory_database(spec or local)
    shared: ExampleDatabase = redis_database(spec)
    if readonly:
        shared = ReadOnlyDatabase(shared)
    return MultiplexedDatabase(directory_database(local), shared)
