"""The materializer side: Kafka -> DuckDB, exactly once, plus live SQL for other processes."""

from rankstream.consumers.query import Database, connect

__all__ = ["Database", "connect"]
