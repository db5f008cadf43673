"""How a table is declared once and everything else is derived from it.

A :class:`Table` lists its :class:`Column` s with their DuckDB types. From that one declaration
come the DDL (``CREATE TABLE``, and the ``ADD COLUMN`` s that bring a database written by an older
version up to date), the Arrow schema the projector and the dump
loader build batches in, and, for the tables filled from the bus, the field list the codec
validates payloads against (``schemas.records``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Column", "Table", "arrow_type"]


@dataclass(frozen=True)
class Column:
    name: str
    #: DuckDB type: BIGINT, INTEGER, DOUBLE, BOOLEAN, VARCHAR, BLOB, ``T[]``, ``STRUCT(a T, ...)[]``.
    type: str
    doc: str = ""
    not_null: bool = False
    #: For tables filled from the bus: ``"required"`` or ``"optional"`` in the payload, or None when
    #: the column comes from the envelope or the materializer (run_id, rank, sent_ns...).
    wire: str | None = None
    #: A SQL expression over the row's other columns that fills this one when rows are inserted
    #: (a key computed once at ingest, so that every later read is cheap).
    derived: str | None = None


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    #: Columns of an older shape that cannot be upgraded in place: a file whose table has one is
    #: given the table anew (only for tables whose old rows need not be kept).
    obsolete: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def insert_sql(self, source: str, present: set[str]) -> str:
        """``INSERT`` of the rows of relation ``source`` (whose columns are ``present``), with the
        derived columns computed."""
        derived = "".join(f", {c.derived} AS {c.name}" for c in self.columns if c.derived and c.name not in present)
        return f"INSERT INTO {self.name} BY NAME SELECT *{derived} FROM {source}"

    def wire_columns(self) -> tuple[Column, ...]:
        """The columns a payload carries, in declaration order."""
        return tuple(c for c in self.columns if c.wire is not None)

    def ddl(self) -> str:
        parts = [(f"{c.name} {c.type}{' NOT NULL' if c.not_null else ''}", c.doc) for c in self.columns]
        if self.primary_key:
            parts.append((f"PRIMARY KEY ({', '.join(self.primary_key)})", ""))
        body = "\n".join(f"    {code}{',' if i < len(parts) - 1 else ''}{f'  -- {doc}' if doc else ''}"
                         for i, (code, doc) in enumerate(parts))
        return f"-- {self.doc}\nCREATE TABLE IF NOT EXISTS {self.name} (\n{body}\n);\n"

    def upgrade_sql(self, existing: set[str]) -> str:
        """What a database written before some of the columns existed needs: those columns added
        (NULL in the old rows; inserts go by name, so the order does not matter), or the table
        made anew when it has an obsolete shape."""
        if set(self.obsolete) & existing:
            return f"DROP TABLE {self.name};\n" + self.ddl()
        return "".join(f"ALTER TABLE {self.name} ADD COLUMN {c.name} {c.type};\n"
                       for c in self.columns if c.name not in existing)

    def arrow_schema(self):
        """The Arrow schema of a batch of this table's rows (pyarrow is imported by the caller's layer)."""
        import pyarrow as pa  # the [server] extra: the rank side declares tables but never builds Arrow

        return pa.schema([(c.name, arrow_type(c.type)) for c in self.columns])


_SCALARS = {"BIGINT": "int64", "UBIGINT": "uint64", "INTEGER": "int32", "DOUBLE": "float64", "BOOLEAN": "bool_", "VARCHAR": "string",
            "BLOB": "binary"}
_STRUCT = re.compile(r"^STRUCT\((.*)\)$")


def arrow_type(sql_type: str) -> Any:
    """The Arrow type of a DuckDB column type."""
    import pyarrow as pa  # see Table.arrow_schema

    text = sql_type.strip()
    if text.endswith("[]"):
        return pa.list_(arrow_type(text[:-2]))
    struct = _STRUCT.match(text)
    if struct:
        fields = [part.strip().split(" ", 1) for part in struct.group(1).split(",")]
        return pa.struct([(name, arrow_type(kind)) for name, kind in fields])
    return getattr(pa, _SCALARS[text])()
