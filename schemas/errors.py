"""The one exception hierarchy of rankstream.

Every error a user can see derives from :class:`RankstreamError`, through one of two kinds:
:class:`TransientError` (retrying the same call later can succeed: broker down, database file
busy, disk full) and :class:`PermanentError` (it cannot: bad configuration, bad input, refused
SQL). :func:`is_transient` is what retry code reads: the materializer retries transient failures
and stops on permanent ones, the Prefect tasks retry only transient ones, and the producer's
delivery spools a message the broker failed transiently but drops (and counts) one it refused for
good. Library errors (kafka-python, duckdb, OS) are translated into these once, at the boundary
where they are caught, with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "RankstreamError",
    "TransientError",
    "PermanentError",
    "is_transient",
    "StorageUnavailable",
    "ConfigError",
    "BrokerUnavailable",
    "DatabaseBusy",
    "BadInput",
    "MessageRefused",
    "QueryError",
]


class RankstreamError(Exception):
    """Base of every rankstream error. ``transient`` errors are worth retrying."""

    transient: bool = False


class TransientError(RankstreamError):
    """Retrying later can succeed: something outside the call is unavailable for now."""

    transient = True


class PermanentError(RankstreamError):
    """Retrying cannot succeed: the input, the configuration or the request must change."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised ``exc`` can succeed. rankstream's errors say so;
    network and disk errors (``OSError``, which includes timeouts) may clear; anything else is a
    bug or bad input, which a retry repeats."""
    if isinstance(exc, RankstreamError):
        return exc.transient
    return isinstance(exc, OSError)


class ConfigError(PermanentError):
    """A configuration key has a bad value; the message names the key, the value and its source."""


class BrokerUnavailable(TransientError):
    """The Kafka bootstrap servers did not answer (or a topic does not exist yet)."""


class DatabaseBusy(TransientError):
    """Another process holds the DuckDB file for writing and serves no queries."""


class StorageUnavailable(TransientError):
    """The database could not be written (disk full, I/O error); nothing of the write was kept."""


class MessageRefused(PermanentError):
    """The broker refused one message for good (too large, invalid record): resending cannot help."""


class BadInput(PermanentError):
    """A file or message that cannot be used. The message names the input and the problem."""


class QueryError(PermanentError):
    """SQL that DuckDB refused (syntax, missing table, write on a read-only session)."""
