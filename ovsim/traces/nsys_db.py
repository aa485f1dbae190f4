"""Reading an Nsight Systems SQLite export by table and column name, whatever the exporter's
version: tables exist only when they have rows and columns come and go between versions, so each
table's columns are read from the file (``PRAGMA table_info``). The importer is
:mod:`ovsim.traces.nsys`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError

NS = 1e-9
# Serialized GlobalId: the low 24 bits are the thread id, the PID (and VM/host id) sit above them.
PROC_SHIFT = 1 << 24

def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def to_int(values: pd.Series, src: str, field: str) -> pd.Series:
    """Int64 from a column that should hold integers; anything else is an error naming the field."""
    if str(values.dtype) == "Int64":
        return values
    num = pd.to_numeric(values, errors="coerce")
    bad = num.isna() & values.notna()
    arr = num.to_numpy(dtype=float, na_value=np.nan)
    frac = np.isfinite(arr) & (np.round(arr) != arr)
    if bad.any() or frac.any():
        first = str(values[bad | frac].iloc[0])
        raise OvsimError(f"{int(bad.sum() + frac.sum())} value(s) are not integers (first: {first!r})", source=src,
                         field=field)
    return pd.Series(pd.array(np.round(arr), dtype="Int64") if len(arr) else pd.array([], dtype="Int64"),
                     index=values.index)


class NsysDb:
    """An open export: its tables and columns as the file spells them, read by name."""

    def __init__(self, con: sqlite3.Connection, src: str) -> None:
        self.con = con
        self.src = src
        rows = con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        self.tables = {str(r[0]) for r in rows}
        self._cols: dict[str, dict[str, str]] = {}
        self.version = ""
        if "META_DATA_EXPORT" in self.tables and {"name", "value"} <= set(self.columns("META_DATA_EXPORT")):
            row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
            self.version = str(row[0]) if row else ""

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> dict[str, str]:
        """Lower-case name -> the file's spelling (SQLite compares column names without case)."""
        if table not in self._cols:
            info = self.con.execute(f"PRAGMA table_info({quote(table)})").fetchall()
            self._cols[table] = {str(r[1]).lower(): str(r[1]) for r in info}
        return self._cols[table]

    def has_columns(self, table: str, names: Sequence[str]) -> bool:
        cols = self.columns(table) if self.has(table) else {}
        return all(n.lower() in cols for n in names)

    def read(self, table: str, required: Sequence[str], optional: Sequence[str] = (), where: str = "") -> pd.DataFrame:
        """The named columns (under the names asked for); optional ones the file lacks are left out."""
        cols = self.columns(table)
        for c in required:
            if c.lower() not in cols:
                version = f" (export schema {self.version})" if self.version else ""
                raise OvsimError(f"required column missing{version}", source=self.src, field=f"{table}.{c}")
        use = [c for c in (*required, *optional) if c.lower() in cols]
        sql = f"SELECT {', '.join(f'{quote(cols[c.lower()])} AS {quote(c)}' for c in use)} FROM {quote(table)}{where}"
        return pd.read_sql_query(sql, self.con, dtype_backend="numpy_nullable")

    def ints(self, df: pd.DataFrame, table: str, col: str) -> pd.Series:
        if col not in df.columns:
            return pd.Series(pd.array([pd.NA] * len(df), dtype="Int64"), index=df.index)
        return to_int(df[col], self.src, f"{table}.{col}")

    def enum(self, table: str) -> dict[int, str]:
        """An ``ENUM_*`` table (id, name, label) as id -> "name | label" ({} if the file has none)."""
        out: dict[int, str] = {}
        if not self.has_columns(table, ("id",)):
            return out
        cols = self.columns(table)
        text_cols = [cols[c] for c in ("name", "label") if c in cols]
        if not text_cols:
            return out
        sql = f"SELECT {quote(cols['id'])}, {', '.join(quote(c) for c in text_cols)} FROM {quote(table)}"
        for row in self.con.execute(sql):
            if isinstance(row[0], int):
                texts = [str(t) for t in row[1:] if t is not None]
                if texts:
                    out[row[0]] = " | ".join(texts)
        return out



def count_skipped(skipped: dict[str, int], key: str, n: int) -> None:
    if n:
        skipped[key] = skipped.get(key, 0) + n
