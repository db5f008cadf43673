"""The one exception hierarchy of rankstream.

Every error a user can see derives from :class:`RankstreamError`. ``transient`` says whether
retrying the same call later can succeed (broker down, database file busy) or not (bad
configuration, bad input). Library errors (kafka-python, duckdb, OS) are translated into these
once, at the boundary where they are caught, with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "RankstreamError",
    "ConfigError",
    "BrokerUnavailable",
    "DatabaseBusy",
    "BadInput",
    "QueryError",
]


class RankstreamError(Exception):
    """Base of every rankstream error. ``transient`` errors are worth retrying."""

    transient: bool = False


class ConfigError(RankstreamError):
    """A configuration key has a bad value; the message names the key, the value and its source."""


class BrokerUnavailable(RankstreamError):
    """The Kafka bootstrap servers did not answer (or a topic does not exist yet)."""

    transient = True


class DatabaseBusy(RankstreamError):
    """Another process holds the DuckDB file for writing and serves no queries."""

    transient = True


class BadInput(RankstreamError):
    """A file or message that cannot be used. The message names the input and the problem."""


class QueryError(RankstreamError):
    """SQL that DuckDB refused (syntax, missing table, write on a read-only session)."""
