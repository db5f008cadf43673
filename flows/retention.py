"""Retention: ``rankstream gc`` and the scheduled ``rankstream-retention`` flow.

A removed run loses its rows in every table (one transaction, through the materializer when it
runs), its producers' spool and its files (``rankstream run``'s report and timeline, and the
timeline flow's files when their folder is given). A tombstone row stays in ``removed_runs``, so
the run is still listed in ``runs`` (with ``removed_at``) and the materializer skips its messages
if the bus delivers them again. A run still in progress (no final heartbeat from every rank, and
a heartbeat in the last ``LIVE_S``) is never removed.
"""

from __future__ import annotations

import glob
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.flows.run_tables import ensure_schema
from rankstream.schemas.config import Config, path_safe
from rankstream.schemas.errors import BadInput
from rankstream.schemas.tables import REMOVED_RUNS, TABLES

__all__ = ["Removal", "collect_garbage", "runs_to_remove", "LIVE_S"]

#: A run that sent a heartbeat (or metadata) this recently and has not ended is in progress: never removed.
LIVE_S = 600

_CANDIDATES_SQL = """
SELECT r.run_id, epoch_ns(r.started_at) AS started_ns, r.world_size,
       r.ended_at IS NULL AND coalesce(r.last_heard_ns, 0) > $live_after AS in_progress
FROM runs r
WHERE r.removed_at IS NULL
ORDER BY r.started_at DESC NULLS LAST, r.run_id
"""


@dataclass
class Removal:
    """What ``collect_garbage`` removed (or, dry, would remove) for one run."""

    run_id: str
    reason: str
    rows: int = 0
    files: list[Path] = field(default_factory=list)

    def line(self, dry_run: bool) -> str:
        verb = "would remove" if dry_run else "removed"
        return (f"{verb} run {self.run_id} ({self.reason}): {self.rows:,} rows, "
                f"{len(self.files)} spool/report/timeline path(s)")


def runs_to_remove(config: Config, *, keep_runs: int | None, older_than_days: float | None,
                   now_ns: int | None = None) -> list[tuple[str, str, int | None, int | None]]:
    """``(run_id, reason, started_ns, world_size)`` of the runs past the limits: all but the
    ``keep_runs`` most recent, and those started more than ``older_than_days`` ago."""
    if keep_runs is None and older_than_days is None:
        raise BadInput("give --keep-runs N, --older-than DAYS, or both")
    if (keep_runs is not None and keep_runs < 0) or (older_than_days is not None and older_than_days < 0):
        raise BadInput("--keep-runs and --older-than must not be negative")
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows = connect(config.db_path).fetchall(_CANDIDATES_SQL, {"live_after": now_ns - LIVE_S * 10**9})
    chosen = []
    for position, (run_id, started_ns, world_size, in_progress) in enumerate(rows):
        if in_progress:
            continue
        if keep_runs is not None and position >= keep_runs:
            reason = f"beyond the {keep_runs} most recent"
        elif older_than_days is not None and started_ns is not None \
                and started_ns < now_ns - older_than_days * 86400 * 10**9:
            reason = f"started more than {older_than_days:g} days ago"
        else:
            continue
        chosen.append((run_id, reason, started_ns, world_size))
    return chosen


def collect_garbage(config: Config, *, keep_runs: int | None = None, older_than_days: float | None = None,
                    timeline_dirs: list[Path] | None = None, dry_run: bool = False) -> list[Removal]:
    """Remove the runs past the limits (see the module docstring); what was removed, run by run."""
    ensure_schema(config.db_path)
    removals = []
    for run_id, reason, started_ns, world_size in runs_to_remove(config, keep_runs=keep_runs,
                                                                 older_than_days=older_than_days):
        removal = Removal(run_id, reason, rows=_count_rows(config, run_id),
                          files=_run_files(config, run_id, timeline_dirs or []))
        if not dry_run:
            _remove_rows(config, removal, started_ns, world_size)
            for path in removal.files:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        removals.append(removal)
    return removals


def _tables_with_runs() -> list[str]:
    return [t.name for t in TABLES if t is not REMOVED_RUNS and any(c.name == "run_id" for c in t.columns)]


def _count_rows(config: Config, run_id: str) -> int:
    counts = " + ".join(f"(SELECT count(*) FROM {name} WHERE run_id = $run)" for name in _tables_with_runs())
    return connect(config.db_path).fetchall(f"SELECT {counts}", {"run": run_id})[0][0]


def _remove_rows(config: Config, removal: Removal, started_ns: int | None, world_size: int | None) -> None:
    """Every table's rows of the run and its tombstone, in one transaction."""
    script: list[tuple[str, dict]] = [(f"DELETE FROM {name} WHERE run_id = $run", {"run": removal.run_id})
                                      for name in _tables_with_runs()]
    script.append(("INSERT OR REPLACE INTO removed_runs VALUES ($run, $now, $started, $world, $rows, $reason)",
                   {"run": removal.run_id, "now": time.time_ns(), "started": started_ns, "world": world_size,
                    "rows": removal.rows, "reason": removal.reason}))
    connect(config.db_path, read_only=False, wait_s=120).script(script)


def _run_files(config: Config, run_id: str, timeline_dirs: list[Path]) -> list[Path]:
    """The run's spool, its ``rankstream run`` folder and its timeline files, where they exist."""
    name = path_safe(run_id)
    found = [path for path in (config.spool_dir / name, config.run_dir(run_id)) if path.exists()]
    for folder in timeline_dirs:
        stem = glob.escape(str(Path(folder) / name))
        found += sorted(Path(p) for pattern in (f"{stem}.json*", f"{stem}.steps*.json*", f"{stem}.part*.json*")
                        for p in glob.glob(pattern))
    return found
