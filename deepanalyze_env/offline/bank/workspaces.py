"""Deterministic writers for the bank's workspaces: one table in several formats and layouts.

Kinds (the workspace id is ``<table>-<kind>``):

* ``csv`` — ``<table>.csv``; ``json`` — ``<table>.json`` (a list of records);
* ``xlsx`` — ``<table>.xlsx`` with the data on sheet ``data`` and the title/source on ``about``;
* ``join`` — ``<table>_info.csv`` and ``<table>_measures.csv``: the columns split in two files
  that share the key ``record_id`` (the measures file in another row order, so pasting the files
  side by side is wrong and a join is needed);
* ``sqlite`` — ``<table>.db`` with the same two parts as tables ``info`` and ``measures``;
* ``messy`` — ``<table>_raw.csv``: the table with missing cells and duplicated rows injected
  (for the missing-value and cleaning families).

Same inputs give the same bytes: CSV and JSON from sorted, explicit data; the XLSX zip rewritten
with fixed timestamps; the SQLite header's counters and library version fixed.
"""

from __future__ import annotations

import io
import json
import math
import random
import re
import sqlite3
import struct
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deepanalyze_env.offline.bank.sources import TableSpec

Kind = Literal["csv", "json", "xlsx", "join", "sqlite", "messy"]
KINDS: tuple[Kind, ...] = ("csv", "json", "xlsx", "join", "sqlite", "messy")
KEY = "record_id"
ZIP_TIME = (2024, 1, 1, 0, 0, 0)
FIXED_STAMP = b"2024-01-01T00:00:00Z"
SQLITE_HEADER_VERSION = 3040001
MAX_ROWS_SPREADSHEET = 2500  # larger tables are not offered as xlsx/json (slow to read, big files)


@dataclass
class Workspace:
    """What a family needs to know about one written workspace."""

    id: str
    table: str
    kind: Kind
    files: list[str]
    columns: list[str]
    info_columns: list[str] = field(default_factory=list)  # join / sqlite: the "info" part
    measure_columns: list[str] = field(default_factory=list)  # join / sqlite: the "measures" part
    injected: dict[str, Any] = field(default_factory=dict)  # messy: what was injected


def kinds_for(spec: TableSpec, rows: int) -> list[Kind]:
    kinds: list[Kind] = ["csv", "messy"]
    if rows <= MAX_ROWS_SPREADSHEET:
        kinds += ["json", "xlsx"]
    if len(spec.numeric) >= 2 and rows <= MAX_ROWS_SPREADSHEET:
        kinds += ["join", "sqlite"]
    return [k for k in KINDS if k in kinds]


def _plain(value: Any) -> Any:
    """numpy scalars → Python; NaN → None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _csv_bytes(frame) -> bytes:
    return frame.to_csv(index=False, lineterminator="\n").encode("utf-8")


def _normalise_xlsx(raw: bytes) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in sorted(src.infolist(), key=lambda i: i.filename):
            data = src.read(info.filename)
            if info.filename == "docProps/core.xml":
                for tag in (rb"dcterms:created", rb"dcterms:modified"):
                    data = re.sub(
                        rb"(<" + tag + rb"[^>]*>)[^<]*(</" + tag + rb">)",
                        rb"\g<1>" + FIXED_STAMP + rb"\g<2>",
                        data,
                    )
            zi = zipfile.ZipInfo(info.filename, date_time=ZIP_TIME)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.create_system = 3
            zi.external_attr = 0o644 << 16
            dst.writestr(zi, data, compresslevel=6)
    return out.getvalue()


def _xlsx_bytes(frame, about: list[tuple[str, str]]) -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "data"
    ws.append([str(c) for c in frame.columns])
    for row in frame.itertuples(index=False):
        ws.append([_plain(v) for v in row])
    info = wb.create_sheet("about")
    for key, value in about:
        info.append([key, value])
    wb.properties.creator = "deepanalyze-env"
    buf = io.BytesIO()
    wb.save(buf)
    return _normalise_xlsx(buf.getvalue())


def _sqlite_bytes(parts: dict[str, Any]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.db"
        con = sqlite3.connect(path)
        try:
            with con:
                for name, frame in parts.items():
                    cols = list(frame.columns)
                    decl = ", ".join(f'"{c}" {_sql_type(frame[c])}' for c in cols)
                    con.execute(f'CREATE TABLE "{name}" ({decl})')
                    marks = ", ".join("?" for _ in cols)
                    con.executemany(
                        f'INSERT INTO "{name}" VALUES ({marks})',
                        [[_plain(v) for v in row] for row in frame.itertuples(index=False)],
                    )
            con.execute("VACUUM")
        finally:
            con.close()
        raw = bytearray(path.read_bytes())
    raw[24:28] = struct.pack(">I", 1)
    raw[92:96] = struct.pack(">I", 1)
    raw[96:100] = struct.pack(">I", SQLITE_HEADER_VERSION)
    return bytes(raw)


def _sql_type(series) -> str:
    kind = series.dtype.kind
    return {"i": "INTEGER", "u": "INTEGER", "f": "REAL", "b": "INTEGER"}.get(kind, "TEXT")


def split_parts(spec: TableSpec, frame, rng: random.Random):
    """The table as (info, measures): key + labels/categories/half the measures, key + the rest."""
    import pandas as pd

    frame = frame.copy()
    frame.insert(0, KEY, range(1, len(frame) + 1))
    numeric = [c for c in spec.numeric if c in frame.columns]
    other = [c for c in frame.columns if c != KEY and c not in numeric]
    half = max(1, len(numeric) // 2)
    info_cols = [KEY, *other, *numeric[:half]]
    measure_cols = [KEY, *numeric[half:]]
    info = frame[info_cols]
    order = list(range(len(frame)))
    rng.shuffle(order)
    measures = frame[measure_cols].iloc[order].reset_index(drop=True)
    return pd.DataFrame(info).reset_index(drop=True), measures


def messy_frame(spec: TableSpec, frame, rng: random.Random):
    """Inject missing cells into two measures and duplicate a few rows, recording what was done."""
    import pandas as pd

    frame = frame.copy().reset_index(drop=True)
    numeric = [c for c in spec.numeric if c in frame.columns]
    targets = rng.sample(numeric, min(2, len(numeric)))
    n = len(frame)
    blanks = {}
    for col in targets:
        k = max(1, round(n * rng.choice([0.03, 0.05, 0.08])))
        rows = sorted(rng.sample(range(n), min(k, n - 1)))
        frame[col] = frame[col].astype("float64")
        frame.loc[rows, col] = float("nan")
        blanks[col] = len(rows)
    dup_count = min(max(1, n // 20), 8)
    dups = sorted(rng.sample(range(n), dup_count))
    order = []
    for i in range(n):
        order.append(i)
        if i in dups:
            order.append(i)
    messy = pd.DataFrame(frame.iloc[order]).reset_index(drop=True)
    return messy, {"blank_cells": blanks, "duplicated_rows": dup_count}


def write_workspace(
    root: Path, spec: TableSpec, frame, kind: Kind, seed: int, title: str, source: str
) -> Workspace:
    """Write one workspace under ``root/<table>-<kind>/`` and describe it."""
    ws_id = f"{spec.name}-{kind}"
    folder = root / ws_id
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:{ws_id}")
    files: dict[str, bytes] = {}
    info_cols: list[str] = []
    measure_cols: list[str] = []
    injected: dict[str, Any] = {}
    columns = [str(c) for c in frame.columns]
    if kind == "csv":
        files[f"{spec.name}.csv"] = _csv_bytes(frame)
    elif kind == "json":
        records = [{str(k): _plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        files[f"{spec.name}.json"] = (json.dumps(records, ensure_ascii=False, indent=1) + "\n").encode(
            "utf-8"
        )
    elif kind == "xlsx":
        files[f"{spec.name}.xlsx"] = _xlsx_bytes(frame, [("title", title), ("source", source)])
    elif kind in ("join", "sqlite"):
        info, measures = split_parts(spec, frame, rng)
        info_cols, measure_cols = list(info.columns), list(measures.columns)
        if kind == "join":
            files[f"{spec.name}_info.csv"] = _csv_bytes(info)
            files[f"{spec.name}_measures.csv"] = _csv_bytes(measures)
        else:
            files[f"{spec.name}.db"] = _sqlite_bytes({"info": info, "measures": measures})
    elif kind == "messy":
        messy, injected = messy_frame(spec, frame, rng)
        files[f"{spec.name}_raw.csv"] = _csv_bytes(messy)
    else:
        raise ValueError(f"unknown workspace kind {kind!r}")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Workspace(ws_id, spec.name, kind, sorted(files), columns, info_cols, measure_cols, injected)
