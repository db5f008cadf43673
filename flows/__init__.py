"""Derived tables: clock alignment, timelines and merged traces, step, communication and
breakdown analyses, collective diagnosis and the live hang watch, plus the Prefect flows that run
them on schedules. Each reads the materialized tables (``rankstream.schemas.tables``) and writes
its own result tables."""
