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
does not answer ``PING``. Nothing falls back silently. No message shows a password: the URL
is printed by :func:`redacted` (``redis://:***@HOST:PORT/DB``) and the password is masked in the
client's own error text.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlparse

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


SECRET = "***"


def redacted(url: str) -> str:
    """``url`` with its password, in the user part or a ``password`` query argument (both read by
    redis-py's ``from_url``), replaced by ``***``: safe to print. Text without one is returned as is."""
    if not _secrets(url):
        return url
    parsed = urlparse(url)
    netloc = parsed.netloc
    if parsed.password is not None:
        user, host = netloc.rpartition("@")[::2]
        netloc = f"{user.partition(':')[0]}:{SECRET}@{host}"
    query = parse_qsl(parsed.query, keep_blank_values=True)
    if any(key == "password" for key, _ in query):
        query = [(key, SECRET if key == "password" else value) for key, value in query]
        return parsed._replace(netloc=netloc, query=urlencode(query, safe="*")).geturl()
    return parsed._replace(netloc=netloc).geturl()


def _secrets(url: str) -> list[str]:
    """The passwords ``url`` holds, as written and percent-decoded, longest first."""
    parsed = urlparse(url)
    found = [parsed.password] if parsed.password else []
    found += [value for key, value in parse_qsl(parsed.query) if key == "password" and value]
    return sorted({s for f in found for s in (f, unquote(f))}, key=len, reverse=True)


def _masked(text: str, url: str) -> str:
    """``text`` (an error message) with every password of ``url`` replaced by ``***``."""
    for secret in _secrets(url):
        text = text.replace(secret, SECRET)
    return text


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
    parsed, shown = urlparse(url), redacted(url)
    if parsed.scheme not in REDIS_SCHEMES or not parsed.hostname:
        raise DatabaseError(f"{shown!r} is not a Redis URL (redis://HOST:PORT/DB)")
    try:  # redis-py parses the URL itself; these raise ValueError for a bad port or database number
        _ = parsed.port
        _ = int(parsed.path.lstrip("/") or 0)
    except ValueError:
        raise DatabaseError(f"{shown!r}: the port and the database number must be integers") from None
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise DatabaseError(
            f"--fp4-db {shown} needs the redis client: pip install 'hypothesis[redis]' (or fp4-conformance[fleet])"
        ) from None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise DatabaseError(f"Redis example database {shown} does not answer: {_masked(str(exc), url)}") from None
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


def describe(db: ExampleDatabase | None) -> str:
    """Where ``db`` keeps examples, for the run's header: ``none``, a folder, ``redis://HOST:PORT/DB``
    (never a password) or several joined by ``+``; ``(read-only)`` marks a replay-only part."""
    if db is None:
        return "none"
    if isinstance(db, DirectoryBasedExampleDatabase):
        return str(db.path)
    if isinstance(db, ReadOnlyDatabase):
        return f"{describe(db._wrapped)} (read-only)"
    if isinstance(db, MultiplexedDatabase):
        return " + ".join(describe(part) for part in db._wrapped)
    client = getattr(db, "redis", None)
    if client is not None:
        kwargs = client.connection_pool.connection_kwargs
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
    return type(db).__name__
