"""Generate the small synthetic data shipped with deepanalyze-env.

Why this script exists
----------------------
The project ships a handful of tasks so that the environment, the reward methods, the CPU
smoke recipe and the tests have something real to run against without downloading anything:

* ``workspaces/<workspace_id>/`` -- four tiny synthetic data folders (CSV, XLSX, SQLite),
* ``tasks/{qa,datatask,openresearch}.jsonl`` -- task files in the layout of contract 1
  (``data`` = ``"workspaces"``, so a workspace lives at ``<workspace_root>/workspaces/<id>``
  with ``workspace_root`` = this ``data/`` folder),
* ``trajectories.jsonl`` -- for every task one ``good`` reference trajectory (assistant turns
  that run cleanly and answer correctly) and one ``bad`` one with a labelled defect.

All of these outputs are committed. This script is the single source of truth for them: edit
it, rerun ``python data/generate.py`` and commit the changed files. ``tests/test_shipped_data.py``
regenerates into a temporary folder and checks the result is byte-identical to what is committed.

Determinism rules (keep them when editing):

* only the standard library and ``openpyxl`` are used -- no numpy/pandas, so the output does not
  depend on their versions;
* every random draw comes from ``random.Random(seed)`` using only integer-based methods
  (``randint``, ``choice``, ``choices``, ``sample``, ``random``); nothing calls libm
  (``gauss``, ``sin`` ...), whose last bits may differ between platforms;
* money is generated in integer cents and measurements in integer tenths, and ground truths are
  computed with exact ``Fraction`` arithmetic; a value that would sit on a rounding tie is
  rejected, so pandas' float arithmetic rounds to the same printed digits;
* the XLSX zip is rewritten with fixed timestamps, fixed metadata and stored (uncompressed)
  entries so that neither the clock nor the zlib build matters;
* the SQLite file is written in one transaction, VACUUMed, and its header's change counters and
  library-version field are set to fixed values.

Usage: ``python data/generate.py [--out DIR]`` (default: the folder this file lives in).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import random
import re
import sqlite3
import struct
import tempfile
import textwrap
import zipfile
from fractions import Fraction
from pathlib import Path

import openpyxl

HERE = Path(__file__).resolve().parent
FIXED_TIME = dt.datetime(2024, 1, 1, 0, 0, 0)
ZIP_TIME = (2024, 1, 1, 0, 0, 0)
# Written into bytes 96..99 of the SQLite header ("SQLITE_VERSION_NUMBER of the library that
# most recently modified the file"), so the file does not record the local SQLite build.
SQLITE_HEADER_VERSION = 3040001


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def rounded(value: Fraction, digits: int) -> float:
    """Round an exact value to ``digits`` decimals, refusing values close to a rounding tie.

    Pandas computes the same quantities in floating point; away from a tie the tiny float error
    cannot change the rounded digits, so the generator and the trajectories' printed output agree.
    """
    scaled = Fraction(value) * 10**digits
    frac = scaled - (scaled.numerator // scaled.denominator)
    if abs(frac - Fraction(1, 2)) < Fraction(1, 10**6):
        raise AssertionError(f"{float(value)!r} is too close to a rounding tie at {digits} digits")
    return float(round(Fraction(value), digits))


def f2(value: Fraction) -> str:
    return f"{rounded(value, 2):.2f}"


def f1(value: Fraction) -> str:
    return f"{rounded(value, 1):.1f}"


def float_fmt(value: float, digits: int) -> str:
    """Format a float computed with libm-free arithmetic, refusing near-ties."""
    scaled = abs(value) * 10**digits
    if abs(scaled - int(scaled) - 0.5) < 1e-6:
        raise AssertionError(f"{value!r} is too close to a rounding tie at {digits} digits")
    return f"{value:.{digits}f}"


def mean(values) -> Fraction:
    values = list(values)
    return Fraction(sum(values), len(values))


def cents(value: int) -> str:
    return f"{value // 100}.{value % 100:02d}"


def tenths(value: int) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    return f"{sign}{value // 10}.{value % 10}"


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_bytes(path, buf.getvalue().encode("utf-8"))


def write_jsonl(path: Path, records: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_bytes(path, text.encode("utf-8"))


def code(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


def text(src: str) -> str:
    """Dedent prose and unwrap its hard line breaks, as a model writes it: paragraphs and
    ``- `` bullets stay on one line each; blank lines and the final ``Answer:`` line are kept."""
    out: list[str] = []
    for line in textwrap.dedent(src).strip("\n").splitlines():
        stripped = line.strip()
        if not stripped:
            out.append("")
        elif out and out[-1] and not stripped.startswith(("- ", "Answer:")):
            out[-1] += " " + stripped
        else:
            out.append(stripped)
    return "\n".join(out)


def turn(analyze=None, code_src=None, answer=None, understand=None, fence=True, prose=None):
    """One assistant action in the DeepAnalyze tag protocol."""
    parts = []
    if understand:
        parts.append(f"<Understand>\n{text(understand)}\n</Understand>")
    if analyze:
        parts.append(f"<Analyze>\n{text(analyze)}\n</Analyze>")
    if prose:  # untagged reasoning, as a policy that forgot the tags would write it
        parts.append(text(prose))
    if code_src is not None:
        body = code(code_src)
        if fence:
            body = f"```python\n{body}\n```"
        parts.append(f"<Code>\n{body}\n</Code>")
    if answer is not None:
        parts.append(f"<Answer>\n{text(answer)}\n</Answer>")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# workspace: retail (sales.csv, stores.csv)
# --------------------------------------------------------------------------------------------
STORES = [
    # store_id, store_name, city, region, opened_year, floor_area_sqm
    ("S01", "Harbor Point", "Portland", "West", 2015, 820),
    ("S02", "Maple Commons", "Columbus", "Midwest", 2018, 640),
    ("S03", "Riverside Plaza", "Austin", "South", 2012, 910),
    ("S04", "Granite Square", "Denver", "West", 2020, 560),
    ("S05", "Lakeshore Market", "Chicago", "Midwest", 2010, 1150),
    ("S06", "Magnolia Row", "Atlanta", "South", 2016, 700),
]
# category: (whole-dollar price range, units range)
CATEGORIES = {
    "Grocery": ((2, 14), (1, 12)),
    "Household": ((4, 29), (1, 6)),
    "Apparel": ((12, 59), (1, 4)),
    "Toys": ((8, 49), (1, 3)),
    "Electronics": ((25, 299), (1, 2)),
}
STORE_ORDER_WEIGHT = {"S01": 10, "S02": 9, "S03": 11, "S04": 8, "S05": 15, "S06": 10}
STORE_CATEGORY_WEIGHTS = {
    "S01": [30, 20, 20, 10, 20],
    "S02": [35, 25, 15, 15, 10],
    "S03": [30, 20, 20, 15, 15],
    "S04": [15, 15, 20, 10, 40],
    "S05": [55, 20, 10, 10, 5],
    "S06": [30, 20, 25, 15, 10],
}


def build_retail(out: Path) -> dict:
    rng = random.Random(20240327)
    store_ids = [s[0] for s in STORES]
    cats = list(CATEGORIES)
    start = dt.date(2024, 1, 1)
    orders = []
    for _ in range(150):
        day = start + dt.timedelta(days=rng.randint(0, 90))
        store = rng.choices(store_ids, weights=[STORE_ORDER_WEIGHT[s] for s in store_ids])[0]
        cat = rng.choices(cats, weights=STORE_CATEGORY_WEIGHTS[store])[0]
        (plo, phi), (ulo, uhi) = CATEGORIES[cat]
        price = rng.randint(plo, phi) * 100 + rng.choice([49, 99])
        units = rng.randint(ulo, uhi)
        payment = rng.choices(["card", "cash", "mobile"], weights=[60, 15, 25])[0]
        orders.append((day, store, cat, units, price, payment))
    orders.sort(key=lambda o: (o[0], o[1], o[2], o[3], o[4]))
    rows = []
    for i, (day, store, cat, units, price, payment) in enumerate(orders):
        rows.append([10001 + i, day.isoformat(), store, cat, units, cents(price), payment])
    ws = out / "workspaces" / "retail"
    write_csv(
        ws / "sales.csv",
        ["order_id", "order_date", "store_id", "category", "units", "unit_price", "payment_method"],
        rows,
    )
    write_csv(
        ws / "stores.csv",
        ["store_id", "store_name", "city", "region", "opened_year", "floor_area_sqm"],
        [list(s) for s in STORES],
    )

    # ---- facts (all money in integer cents) ----
    store_by_id = {s[0]: s for s in STORES}
    rev = [o[3] * o[4] for o in orders]
    months = ["2024-01", "2024-02", "2024-03"]
    month_of = [o[0].strftime("%Y-%m") for o in orders]

    march_rev = {s: 0 for s in store_ids}
    march_orders = {s: 0 for s in store_ids}
    for o, r, m in zip(orders, rev, month_of, strict=True):
        if m == "2024-03":
            march_rev[o[1]] += r
            march_orders[o[1]] += 1
    ranked = sorted(store_ids, key=lambda s: -march_rev[s])
    assert march_rev[ranked[0]] > march_rev[ranked[1]] * 1.05, "March winner not clear"
    by_count = sorted(store_ids, key=lambda s: -march_orders[s])
    assert march_orders[by_count[0]] > march_orders[by_count[1]], "March order-count tie"
    assert by_count[0] != ranked[0], "bad trajectory would be right by accident"

    regions = sorted({s[3] for s in STORES})
    pivot = {(g, m): 0 for g in regions for m in months}
    for o, r, m in zip(orders, rev, month_of, strict=True):
        pivot[(store_by_id[o[1]][3], m)] += r
    region_total = {g: sum(pivot[(g, m)] for m in months) for g in regions}
    top_region = max(regions, key=lambda g: region_total[g])
    assert sorted(region_total.values())[-1] > sorted(region_total.values())[-2]

    total = sum(rev)
    cat_rev = {c: 0 for c in cats}
    cat_n = {c: 0 for c in cats}
    for o, r in zip(orders, rev, strict=True):
        cat_rev[o[2]] += r
        cat_n[o[2]] += 1
    month_rev = {m: sum(r for r, mm in zip(rev, month_of, strict=True) if mm == m) for m in months}
    store_rev = {s: sum(r for o, r in zip(orders, rev, strict=True) if o[1] == s) for s in store_ids}
    store_n = {s: sum(1 for o in orders if o[1] == s) for s in store_ids}
    store_cat_rev = {(s, c): 0 for s in store_ids for c in cats}
    for o, r in zip(orders, rev, strict=True):
        store_cat_rev[(o[1], o[2])] += r
    return {
        "n_orders": len(orders),
        "march_rev": march_rev,
        "march_orders": march_orders,
        "march_winner": store_by_id[ranked[0]][1],
        "march_winner_id": ranked[0],
        "march_count_winner": store_by_id[by_count[0]][1],
        "months": months,
        "regions": regions,
        "pivot": pivot,
        "region_total": region_total,
        "top_region": top_region,
        "total": total,
        "cat_rev": cat_rev,
        "cat_n": cat_n,
        "month_rev": month_rev,
        "store_rev": store_rev,
        "store_n": store_n,
        "store_cat_rev": store_cat_rev,
        "store_by_id": store_by_id,
    }


# --------------------------------------------------------------------------------------------
# workspace: inventory (inventory.xlsx with sheets "products" and "stock")
# --------------------------------------------------------------------------------------------
PRODUCTS = [
    ("SKU-1001", "Cordless Drill 18V", "Tools", "Apex Tools", (4500, 8900)),
    ("SKU-1002", "Claw Hammer 16oz", "Tools", "Apex Tools", (900, 1800)),
    ("SKU-1003", "Tape Measure 8m", "Tools", "Apex Tools", (600, 1400)),
    ("SKU-1004", "Socket Set 40pc", "Tools", "Northwind Supply", (2800, 5200)),
    ("SKU-1005", "LED Bulb 4-pack", "Lighting", "BrightHome", (700, 1600)),
    ("SKU-1006", "Desk Lamp", "Lighting", "BrightHome", (1800, 3900)),
    ("SKU-1007", "Outdoor Floodlight", "Lighting", "BrightHome", (2400, 4800)),
    ("SKU-1008", "Extension Cord 5m", "Electrical", "Northwind Supply", (800, 1700)),
    ("SKU-1009", "Power Strip 6-outlet", "Electrical", "Northwind Supply", (1100, 2300)),
    ("SKU-1010", "Wall Plug Adapter", "Electrical", "Voltline", (300, 900)),
    ("SKU-1011", "Garden Hose 20m", "Garden", "Greenleaf", (1900, 3600)),
    ("SKU-1012", "Pruning Shears", "Garden", "Greenleaf", (1000, 2200)),
    ("SKU-1013", "Potting Soil 20L", "Garden", "Greenleaf", (500, 1200)),
    ("SKU-1014", "Watering Can 10L", "Garden", "Greenleaf", (700, 1500)),
    ("SKU-1015", "Interior Paint 2.5L", "Paint", "ColorCraft", (1800, 3400)),
    ("SKU-1016", "Paint Roller Kit", "Paint", "ColorCraft", (900, 1900)),
    ("SKU-1017", "Masking Tape 3-pack", "Paint", "ColorCraft", (400, 900)),
    ("SKU-1018", "Wood Screws 200pc", "Fasteners", "Apex Tools", (500, 1100)),
    ("SKU-1019", "Wall Anchors 100pc", "Fasteners", "Voltline", (400, 1000)),
    ("SKU-1020", "Cable Ties 500pc", "Fasteners", "Northwind Supply", (600, 1300)),
]
WAREHOUSES = ["East", "North", "South"]


def _normalise_xlsx(raw: bytes) -> bytes:
    """Rewrite an openpyxl zip with fixed timestamps/metadata and stored entries."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "docProps/core.xml":
                stamp = FIXED_TIME.strftime("%Y-%m-%dT%H:%M:%SZ").encode()
                data = re.sub(
                    rb"(<dcterms:created[^>]*>)[^<]*(</dcterms:created>)", rb"\g<1>" + stamp + rb"\g<2>", data
                )
                data = re.sub(
                    rb"(<dcterms:modified[^>]*>)[^<]*(</dcterms:modified>)",
                    rb"\g<1>" + stamp + rb"\g<2>",
                    data,
                )
            zi = zipfile.ZipInfo(info.filename, date_time=ZIP_TIME)
            zi.compress_type = zipfile.ZIP_STORED
            zi.create_system = 3
            zi.external_attr = 0o644 << 16
            dst.writestr(zi, data)
    return out.getvalue()


def build_inventory(out: Path) -> dict:
    rng = random.Random(20240615)
    products = []
    for sku, name, cat, supplier, (lo, hi) in PRODUCTS:
        cost = rng.randint(lo // 10, hi // 10) * 10 - rng.choice([0, 1]) * 1
        reorder = rng.choice(range(20, 85, 5))
        products.append((sku, name, cat, supplier, cost, reorder))
    stock = []
    for sku, *_ in products:
        houses = sorted(rng.sample(WAREHOUSES, rng.choice([2, 2, 3])))
        low = rng.random() < 0.3
        for wh in houses:
            on_hand = rng.randint(0, 14) if low else rng.randint(8, 60)
            counted = dt.date(2024, 6, 3) + dt.timedelta(days=rng.randint(0, 25))
            stock.append((sku, wh, on_hand, counted))

    wb = openpyxl.Workbook()
    wb.properties.creator = "deepanalyze-env data/generate.py"
    wb.properties.created = FIXED_TIME
    wb.properties.modified = FIXED_TIME
    ws = wb.active
    ws.title = "products"
    ws.append(["sku", "product_name", "category", "supplier", "unit_cost", "reorder_level"])
    for sku, name, cat, supplier, cost, reorder in products:
        ws.append([sku, name, cat, supplier, float(cents(cost)), reorder])
    ws2 = wb.create_sheet("stock")
    ws2.append(["sku", "warehouse", "on_hand", "last_counted"])
    for sku, wh, on_hand, counted in stock:
        ws2.append([sku, wh, on_hand, counted])
        ws2.cell(row=ws2.max_row, column=4).number_format = "yyyy-mm-dd"
    buf = io.BytesIO()
    wb.save(buf)
    write_bytes(out / "workspaces" / "inventory" / "inventory.xlsx", _normalise_xlsx(buf.getvalue()))

    # ---- facts ----
    prod = {p[0]: p for p in products}
    total_on_hand = {p[0]: 0 for p in products}
    for sku, _wh, on_hand, _ in stock:
        total_on_hand[sku] += on_hand
    below = sorted(s for s in total_on_hand if total_on_hand[s] < prod[s][5])
    value = {w: 0 for w in WAREHOUSES}
    wrong_value = {w: 0 for w in WAREHOUSES}
    for sku, wh, on_hand, _ in stock:
        value[wh] += on_hand * prod[sku][4]
        wrong_value[wh] += prod[sku][5] * prod[sku][4]
    # a bad trajectory compares per-warehouse rows instead of totals: make sure that differs
    below_rows = {sku for sku, wh, on_hand, _ in stock if on_hand < prod[sku][5]}
    assert 4 <= len(below) <= 9, below
    assert len(below_rows) != len(below)
    return {
        "n_products": len(products),
        "n_stock_rows": len(stock),
        "below": below,
        "below_names": [prod[s][1] for s in below],
        "total_on_hand": total_on_hand,
        "value": value,
        "value_total": sum(value.values()),
        "wrong_value": wrong_value,
        "wrong_value_total": sum(wrong_value.values()),
    }


# --------------------------------------------------------------------------------------------
# workspace: clinic (clinic.db with tables "patients" and "visits")
# --------------------------------------------------------------------------------------------
CITIES = ["Fairmont", "Lakeview", "Riverton", "Springfield"]
DIAGNOSES = ["Routine checkup", "Hypertension", "Type 2 diabetes", "Asthma", "Back pain"]


def _normalise_sqlite(raw: bytes) -> bytes:
    b = bytearray(raw)
    assert b[:16] == b"SQLite format 3\x00"
    b[24:28] = struct.pack(">I", 1)  # file change counter
    b[92:96] = struct.pack(">I", 1)  # version-valid-for (equal to the change counter)
    b[96:100] = struct.pack(">I", SQLITE_HEADER_VERSION)
    return bytes(b)


def build_clinic(out: Path) -> dict:
    rng = random.Random(20240117)
    patients = []
    for pid in range(1, 41):
        age = rng.randint(22, 84)
        if pid in (7, 23, 31):
            age = 60  # boundary cases for "older than 60"
        sex = rng.choice(["F", "M"])
        smoker = 1 if rng.random() < 0.25 else 0
        city = rng.choice(CITIES)
        patients.append((pid, sex, age, smoker, city))
    visits = []
    for pid, _sex, age, smoker, _city in patients:
        n = rng.choice([1, 2, 2, 3, 3, 4])
        days = sorted(rng.sample(range(2, 180), n))
        old = age >= 55
        for day in days:
            dx = rng.choices(DIAGNOSES, weights=[30, 30 if old else 10, 20 if old else 8, 10, 12])[0]
            sbp = (
                102
                + (age - 20) // 2
                + 9 * smoker
                + {"Hypertension": 18, "Type 2 diabetes": 7}.get(dx, 0)
                + rng.randint(-9, 9)
                + rng.randint(-6, 6)
            )
            dbp = (
                64
                + (age - 20) // 4
                + 4 * smoker
                + {"Hypertension": 10, "Type 2 diabetes": 3}.get(dx, 0)
                + rng.randint(-6, 6)
            )
            hr = 62 + 6 * smoker + rng.randint(-8, 14) + (8 if dx == "Asthma" else 0)
            date = dt.date(2024, 1, 1) + dt.timedelta(days=day)
            visits.append((date, pid, sbp, dbp, hr, dx))
    visits.sort(key=lambda v: (v[0], v[1]))
    visits = [(i + 1, v[1], v[0].isoformat(), v[2], v[3], v[4], v[5]) for i, v in enumerate(visits)]

    path = out / "workspaces" / "clinic" / "clinic.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_db = os.path.join(tmp, "clinic.db")
        con = sqlite3.connect(tmp_db)
        con.executescript(
            """
            CREATE TABLE patients (
                patient_id INTEGER PRIMARY KEY,
                sex TEXT NOT NULL,
                age INTEGER NOT NULL,
                smoker INTEGER NOT NULL,
                city TEXT NOT NULL
            );
            CREATE TABLE visits (
                visit_id INTEGER PRIMARY KEY,
                patient_id INTEGER NOT NULL REFERENCES patients(patient_id),
                visit_date TEXT NOT NULL,
                systolic_bp INTEGER NOT NULL,
                diastolic_bp INTEGER NOT NULL,
                heart_rate INTEGER NOT NULL,
                diagnosis TEXT NOT NULL
            );
            """
        )
        with con:
            con.executemany("INSERT INTO patients VALUES (?, ?, ?, ?, ?)", patients)
            con.executemany("INSERT INTO visits VALUES (?, ?, ?, ?, ?, ?, ?)", visits)
        con.execute("VACUUM")
        con.close()
        raw = Path(tmp_db).read_bytes()
    write_bytes(path, _normalise_sqlite(raw))

    # ---- facts ----
    age_of = {p[0]: p[2] for p in patients}
    smoker_of = {p[0]: p[3] for p in patients}
    over60 = [v[3] for v in visits if age_of[v[1]] > 60]
    ge60 = [v[3] for v in visits if age_of[v[1]] >= 60]
    qa_mean = rounded(mean(over60), 2)
    bad_mean = rounded(mean(ge60), 2)
    assert qa_mean != bad_mean
    sbp = [v[3] for v in visits]
    ages = [age_of[v[1]] for v in visits]
    n = len(visits)
    sxx = n * sum(a * a for a in ages) - sum(ages) ** 2
    syy = n * sum(s * s for s in sbp) - sum(sbp) ** 2
    sxy = n * sum(a * s for a, s in zip(ages, sbp, strict=True)) - sum(ages) * sum(sbp)
    r = sxy / (sxx * syy) ** 0.5
    by_dx = {}
    for v in visits:
        by_dx.setdefault(v[6], []).append(v[3])
    by_smoker = {0: [], 1: []}
    for v in visits:
        by_smoker[smoker_of[v[1]]].append(v[3])
    high = sum(1 for s in sbp if s >= 140)
    dx_age = {dx: mean(age_of[v[1]] for v in visits if v[6] == dx) for dx in by_dx}
    # the openresearch report's caveat says these diagnoses come from older patients
    assert min(dx_age["Hypertension"], dx_age["Type 2 diabetes"]) > mean(ages) + 2
    return {
        "n_patients": len(patients),
        "n_visits": n,
        "n_over60_visits": len(over60),
        "qa_mean": qa_mean,
        "bad_mean": bad_mean,
        "mean_sbp": mean(sbp),
        "mean_dbp": mean(v[4] for v in visits),
        "high": high,
        "high_pct": Fraction(high * 100, n),
        "by_dx": {k: (len(v), mean(v)) for k, v in by_dx.items()},
        "dx_age": dx_age,
        "mean_age": mean(ages),
        "by_smoker": {k: mean(v) for k, v in by_smoker.items()},
        "r": r,
        "slope": Fraction(sxy, sxx),
    }


# --------------------------------------------------------------------------------------------
# workspace: sensors (readings.csv, hourly, three sensors, a few gaps and one glitch)
# --------------------------------------------------------------------------------------------
SENSORS = [("S1", "greenhouse_north"), ("S2", "greenhouse_south"), ("S3", "cold_storage")]
# diurnal temperature offsets in tenths of a degree for hours 0..23
DIURNAL = [
    -40,
    -45,
    -50,
    -55,
    -58,
    -55,
    -45,
    -30,
    -10,
    10,
    30,
    45,
    55,
    60,
    58,
    50,
    38,
    25,
    10,
    0,
    -10,
    -20,
    -28,
    -35,
]
GLITCH = ("S1", "2024-05-01 13:00", 850)


def build_sensors(out: Path) -> dict:
    rng = random.Random(20240501)
    rows = []  # [timestamp, sensor, location, temp_tenths|None, hum_tenths|None, pres_tenths|None]
    pressure = 10152
    for day in (1, 2):
        for hour in range(24):
            pressure += rng.randint(-4, 2)
            ts = f"2024-05-{day:02d} {hour:02d}:00"
            for sid, loc in SENSORS:
                if sid == "S3":
                    temp = 42 + DIURNAL[hour] // 10 + rng.randint(-5, 5)
                    hum = 880 + rng.randint(-25, 25)
                else:
                    base = 220 if sid == "S1" else 238
                    prof = DIURNAL[hour] if sid == "S1" else DIURNAL[hour] * 6 // 5
                    temp = base + prof + (8 if day == 2 else 0) + rng.randint(-6, 6)
                    hum = 650 - DIURNAL[hour] * 2 + rng.randint(-30, 30)
                pres = pressure + rng.randint(-2, 2)
                if (sid, ts) == GLITCH[:2]:
                    temp = GLITCH[2]
                rows.append([ts, sid, loc, temp, hum, pres])
    n = len(rows)
    candidates = [i for i, r in enumerate(rows) if (r[1], r[0]) != GLITCH[:2]]
    picked = rng.sample(candidates, 12)
    temp_missing = set(picked[:6])
    hum_missing = set(picked[6:11])
    pres_missing = set(picked[11:])
    # make sure the QA slice (S2 on 2024-05-02) contains a gap
    s2_day2 = [i for i, r in enumerate(rows) if r[1] == "S2" and r[0].startswith("2024-05-02")]
    if not temp_missing & set(s2_day2):
        free = [i for i in s2_day2 if i not in hum_missing | pres_missing]
        temp_missing.add(free[len(free) // 2])
    for i in temp_missing:
        rows[i][3] = None
    for i in hum_missing:
        rows[i][4] = None
    for i in pres_missing:
        rows[i][5] = None
    write_csv(
        out / "workspaces" / "sensors" / "readings.csv",
        ["timestamp", "sensor_id", "location", "temperature_c", "humidity_pct", "pressure_hpa"],
        [[r[0], r[1], r[2]] + ["" if v is None else tenths(v) for v in r[3:]] for r in rows],
    )

    # ---- facts (measurements in integer tenths) ----
    day2_s2 = [r[3] for r in rows if r[1] == "S2" and r[0].startswith("2024-05-02")]
    present = [t for t in day2_s2 if t is not None]
    qa_mean = rounded(mean(present) / 10, 2)
    bad_mean = rounded(Fraction(sum(present), 10 * len(day2_s2)), 2)
    assert qa_mean != bad_mean

    keep = [r for r in rows if r[3] is not None and -100 <= r[3] <= 600]
    dropped = n - len(keep)
    filled = sum(1 for r in keep if r[4] is None)
    clean_mean = {sid: mean(r[3] for r in keep if r[1] == sid) / 10 for sid, _ in SENSORS}
    glitch_rows = sum(1 for r in rows if r[3] is not None and not -100 <= r[3] <= 600)
    return {
        "n_rows": n,
        "n_temp_missing": len(temp_missing),
        "n_hum_missing": len(hum_missing),
        "n_pres_missing": len(pres_missing),
        "day2_s2_n": len(day2_s2),
        "day2_s2_missing": len(day2_s2) - len(present),
        "qa_mean": qa_mean,
        "bad_mean": bad_mean,
        "dropped": dropped,
        "glitch_rows": glitch_rows,
        "filled": filled,
        "n_clean": len(keep),
        "clean_mean": clean_mean,
    }


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------
def task(tid, method, workspace, instruction, reward_spec):
    return {
        "id": tid,
        "method": method,
        "instruction": instruction,
        "data": "workspaces",
        "workspace_id": workspace,
        "reward_spec": reward_spec,
        "input_seq": instruction,
    }


def build_tasks(R, inv, C, S):
    months = R["months"]
    pivot_lines = "; ".join(
        f"{g}: " + ", ".join(f"{m} {f2(Fraction(R['pivot'][(g, m)], 100))}" for m in months)
        for g in R["regions"]
    )
    qa = [
        task(
            "qa-retail-001",
            "qa",
            "retail",
            "Using sales.csv and stores.csv, which store had the highest total revenue in March "
            "2024? Revenue of an order is units × unit_price. Answer with the store name.",
            {"method": "qa", "ground_truth": R["march_winner"]},
        ),
        task(
            "qa-inventory-001",
            "qa",
            "inventory",
            "In inventory.xlsx, how many SKUs have a total on-hand quantity (summed over all "
            "warehouses in the 'stock' sheet) below their reorder_level from the 'products' "
            "sheet? Answer with a single integer.",
            {"method": "qa", "ground_truth": len(inv["below"])},
        ),
        task(
            "qa-clinic-001",
            "qa",
            "clinic",
            "Using the SQLite database clinic.db, what is the mean systolic blood pressure over "
            "all visits of patients older than 60 (age > 60)? Round to 2 decimals.",
            {"method": "qa", "ground_truth": C["qa_mean"]},
        ),
        task(
            "qa-sensors-001",
            "qa",
            "sensors",
            "In readings.csv, what is the mean temperature_c recorded by sensor S2 on "
            "2024-05-02, ignoring missing readings? Round to 2 decimals.",
            {"method": "qa", "ground_truth": S["qa_mean"]},
        ),
    ]
    sensor_means = ", ".join(f"{sid} {f2(S['clean_mean'][sid])}" for sid, _ in SENSORS)
    wh_values = ", ".join(f"{w} {f2(Fraction(inv['value'][w], 100))}" for w in WAREHOUSES)
    datatask = [
        task(
            "datatask-sensors-001",
            "datatask",
            "sensors",
            "Clean readings.csv: drop rows whose temperature_c is missing or outside the "
            "plausible range -10 to 60 °C, fill missing humidity_pct values with the median "
            "humidity of the same sensor (computed on the remaining rows), and save the result "
            "with the same columns as readings_clean.csv. Report how many rows were dropped, how "
            "many humidity values were filled, and the mean temperature per sensor after "
            "cleaning (2 decimals).",
            {
                "method": "datatask",
                "ground_truth": (
                    f"{S['dropped']} rows dropped ({S['n_temp_missing']} with missing temperature, "
                    f"{S['glitch_rows']} out-of-range reading of 85.0 °C); {S['filled']} missing "
                    f"humidity values filled with per-sensor medians; {S['n_clean']} rows saved to "
                    f"readings_clean.csv. Mean temperature after cleaning: {sensor_means}."
                ),
                "function": ["judge_accuracy"],
            },
        ),
        task(
            "datatask-retail-001",
            "datatask",
            "retail",
            "Build a pivot table of total revenue (units × unit_price) with one row per store "
            "region (from stores.csv) and one column per month (2024-01, 2024-02, 2024-03), "
            "values rounded to 2 decimals, and save it as summary.csv. Report the table and "
            "which region had the highest revenue over the whole quarter.",
            {
                "method": "datatask",
                "ground_truth": (
                    f"Revenue by region and month: {pivot_lines}. Highest quarterly revenue: "
                    f"{R['top_region']} ({f2(Fraction(R['region_total'][R['top_region']], 100))}). "
                    f"Pivot saved as summary.csv."
                ),
                "function": ["judge_accuracy"],
            },
        ),
        task(
            "datatask-inventory-001",
            "datatask",
            "inventory",
            "Using inventory.xlsx, compute the stock value (on_hand × unit_cost) per warehouse, "
            "rounded to 2 decimals, and save it as warehouse_value.csv with columns warehouse and "
            "stock_value. Also list the SKUs whose total on-hand quantity over all warehouses is "
            "below their reorder_level.",
            {
                "method": "datatask",
                "ground_truth": (
                    f"Stock value per warehouse: {wh_values} (total "
                    f"{f2(Fraction(inv['value_total'], 100))}), saved as warehouse_value.csv. SKUs "
                    f"below reorder level ({len(inv['below'])}): {', '.join(inv['below'])}."
                ),
                "function": ["judge_accuracy"],
            },
        ),
    ]
    openresearch = [
        task(
            "openresearch-clinic-001",
            "openresearch",
            "clinic",
            "Explore the clinic database clinic.db and write a short analytical report on how "
            "blood pressure relates to patient age, smoking status and diagnosis. Support the "
            "findings with numbers and at least one figure saved to a file.",
            {"method": "openresearch", "ground_truth": "", "function": ["judge_opendomain"]},
        ),
        task(
            "openresearch-retail-001",
            "openresearch",
            "retail",
            "Analyse the retail sales data (sales.csv, stores.csv) and write a short report on "
            "what drives revenue across product categories, months and stores. Include key "
            "figures and at least one chart saved to a file.",
            {"method": "openresearch", "ground_truth": "", "function": ["judge_opendomain"]},
        ),
    ]
    return {"qa": qa, "datatask": datatask, "openresearch": openresearch}


# --------------------------------------------------------------------------------------------
# trajectories
# --------------------------------------------------------------------------------------------
RETAIL_LOAD = """
    import pandas as pd
    sales = pd.read_csv('sales.csv', parse_dates=['order_date'])
    stores = pd.read_csv('stores.csv')
    print(sales.shape, stores.shape)
    print(sales.head())
    print(sales.dtypes)
    print(stores)
"""


def traj_qa_retail(R):
    winner = R["march_winner"]
    mrev = {R["store_by_id"][s][1]: f2(Fraction(v, 100)) for s, v in R["march_rev"].items()}
    good = [
        turn(
            analyze="""
            I need total March 2024 revenue per store. First I will inspect both files to see the
            column names and types, and how stores are identified.
        """,
            code_src=RETAIL_LOAD,
        ),
        turn(
            understand=f"""
            sales.csv has {R["n_orders"]} orders with order_date, store_id, category, units and
            unit_price; stores.csv maps the six store_id values to store_name, city and region.
        """,
            analyze="""
            Revenue per order is units * unit_price. I will keep March 2024 orders, sum revenue per
            store, attach store names and sort descending.
        """,
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv', parse_dates=['order_date'])
            stores = pd.read_csv('stores.csv')
            sales['revenue'] = sales['units'] * sales['unit_price']
            march = sales[(sales['order_date'] >= '2024-03-01') & (sales['order_date'] < '2024-04-01')]
            per_store = march.groupby('store_id')['revenue'].sum().reset_index()
            per_store = per_store.merge(stores[['store_id', 'store_name']], on='store_id')
            per_store = per_store.sort_values('revenue', ascending=False)
            for _, row in per_store.iterrows():
                print(f"{row['store_name']}: {row['revenue']:.2f}")
            print('Top store:', per_store.iloc[0]['store_name'])
        """,
        ),
        turn(
            analyze=f"""
            The ranking is clear: {winner} leads March 2024 with {mrev[winner]} in revenue, ahead
            of the other stores.
        """,
            answer=f"""
            I computed revenue as units × unit_price, restricted orders to March 2024 and summed
            per store. {winner} had the highest March revenue ({mrev[winner]}).

            Answer: {winner}
        """,
        ),
    ]
    bad_store = R["march_count_winner"]
    bad = [
        turn(
            analyze="I will load the sales file and look at its structure.",
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv')
            print(sales.head())
        """,
        ),
        turn(
            analyze="""
            The busiest store in March should have the most revenue, so I will count March orders
            per store.
        """,
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv')
            stores = pd.read_csv('stores.csv')
            march = sales[sales['order_date'].str.startswith('2024-03')]
            counts = march.groupby('store_id').size().rename('orders').reset_index()
            counts = counts.merge(stores, on='store_id').sort_values('orders', ascending=False)
            print(counts[['store_name', 'orders']])
        """,
        ),
        turn(
            analyze=f"{bad_store} has the most March orders, so it has the highest revenue.",
            answer=f"""
            {bad_store} had the most orders in March 2024.

            Answer: {bad_store}
        """,
        ),
    ]
    return good, ("wrong_aggregation", bad)


def traj_qa_inventory(inv):
    n = len(inv["below"])
    good = [
        turn(
            analyze="""
            The workbook should have a 'products' sheet and a 'stock' sheet. I will list the
            sheets and preview each one.
        """,
            code_src="""
            import pandas as pd
            sheets = pd.read_excel('inventory.xlsx', sheet_name=None)
            for name, frame in sheets.items():
                print(name, frame.shape)
                print(frame.head())
        """,
        ),
        turn(
            understand=f"""
            'products' has {inv["n_products"]} SKUs with unit_cost and reorder_level; 'stock' has
            {inv["n_stock_rows"]} rows, one per SKU and warehouse, with on_hand.
        """,
            analyze="""
            A SKU can be stocked in several warehouses, so I must sum on_hand per SKU first and only
            then compare the total with reorder_level.
        """,
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            totals = stock.groupby('sku', as_index=False)['on_hand'].sum()
            merged = products.merge(totals, on='sku', how='left').fillna({'on_hand': 0})
            below = merged[merged['on_hand'] < merged['reorder_level']]
            print(below[['sku', 'product_name', 'on_hand', 'reorder_level']].to_string(index=False))
            print('SKUs below reorder level:', len(below))
        """,
        ),
        turn(
            analyze=f"The filtered table lists {n} SKUs whose summed stock is under reorder_level.",
            answer=f"""
            After summing on_hand across warehouses per SKU and comparing with reorder_level, {n}
            SKUs are below their reorder level: {", ".join(inv["below"])}.

            Answer: {n}
        """,
        ),
    ]
    bad = [
        turn(
            prose="Let me open the workbook.",
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            print(products.head())
            print(stock.head())
        """,
        ),
        turn(
            prose="Sum stock per SKU and compare with the reorder level.",
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            totals = stock.groupby('sku', as_index=False)['on_hand'].sum()
            merged = products.merge(totals, on='sku')
            print((merged['on_hand'] < merged['reorder_level']).sum())
        """,
        ),
        turn(
            answer=f"""
            {n} SKUs are below their reorder level.

            Answer: {n}
        """
        ),
    ]
    return good, ("missing_analyze_tags", bad)


def traj_qa_clinic(C):
    good = [
        turn(
            analyze="""
            The data is a SQLite database. I will list its tables and their columns before
            writing the query.
        """,
            code_src="""
            import sqlite3
            import pandas as pd
            con = sqlite3.connect('clinic.db')
            tables = pd.read_sql_query("SELECT name FROM sqlite_master WHERE type = 'table'", con)
            print(tables)
            for name in tables['name']:
                print(name, pd.read_sql_query(f'PRAGMA table_info({name})', con)['name'].tolist())
            print(pd.read_sql_query('SELECT * FROM visits LIMIT 5', con))
            con.close()
        """,
        ),
        turn(
            understand="""
            'patients' holds age per patient_id and 'visits' holds one row per visit with
            systolic_bp; the tables join on patient_id.
        """,
            analyze="""
            I will join visits to patients, keep patients with age strictly greater than 60 and
            average systolic_bp over those visits.
        """,
            code_src="""
            import sqlite3
            import pandas as pd
            con = sqlite3.connect('clinic.db')
            query = 'SELECT v.systolic_bp, p.age FROM visits v JOIN patients p ON v.patient_id = p.patient_id'
            df = pd.read_sql_query(query, con)
            con.close()
            older = df[df['age'] > 60]
            print('visits of patients over 60:', len(older))
            print('mean systolic:', round(older['systolic_bp'].mean(), 2))
        """,
        ),
        turn(
            analyze=f"""
            {C["n_over60_visits"]} visits belong to patients older than 60; their mean systolic
            pressure is {C["qa_mean"]!r} mmHg.
        """,
            answer=f"""
            Joining visits with patients and keeping patients with age > 60 gives
            {C["n_over60_visits"]} visits with a mean systolic blood pressure of
            {C["qa_mean"]!r} mmHg.

            Answer: {C["qa_mean"]!r}
        """,
        ),
    ]
    bad = [
        turn(
            analyze="I will query the visits table directly for blood pressure of older patients.",
            code_src="""
            import sqlite3
            import pandas as pd
            con = sqlite3.connect('clinic.db')
            df = pd.read_sql_query('SELECT systolic, age FROM visits WHERE age > 60', con)
            print(df['systolic'].mean())
        """,
        ),
        turn(
            analyze="""
            The query failed. I will join the tables and include patients who are 60 as well, since
            they are in the older group.
        """,
            code_src="""
            import sqlite3
            import pandas as pd
            con = sqlite3.connect('clinic.db')
            query = 'SELECT v.systolic_bp, p.age FROM visits v JOIN patients p ON v.patient_id = p.patient_id'
            df = pd.read_sql_query(query, con)
            print(round(df[df['age'] >= 60]['systolic_bp'].mean(), 2))
        """,
        ),
        turn(
            analyze="The mean for the older patients is computed.",
            answer=f"""
            The mean systolic blood pressure of older patients is {C["bad_mean"]!r} mmHg.

            Answer: {C["bad_mean"]!r}
        """,
        ),
    ]
    return good, ("exception_then_wrong_answer", bad)


def traj_qa_sensors(S):
    good = [
        turn(
            analyze="""
            I will load readings.csv, check the columns, the sensors present and how many values
            are missing.
        """,
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv', parse_dates=['timestamp'])
            print(df.head())
            print(df['sensor_id'].value_counts())
            print(df.isna().sum())
        """,
        ),
        turn(
            understand="""
            There are hourly readings for three sensors and a few missing temperature_c values,
            which pandas reads as NaN.
        """,
            analyze="""
            I will select sensor S2 on 2024-05-02 and take the mean of temperature_c; pandas' mean
            skips NaN, which is what "ignoring missing readings" asks for.
        """,
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv', parse_dates=['timestamp'])
            sel = df[(df['sensor_id'] == 'S2') & (df['timestamp'].dt.strftime('%Y-%m-%d') == '2024-05-02')]
            print('rows:', len(sel), 'missing temperature:', sel['temperature_c'].isna().sum())
            print('mean temperature:', round(sel['temperature_c'].mean(), 2))
        """,
        ),
        turn(
            analyze=f"""
            S2 has {S["day2_s2_n"]} readings on 2024-05-02, {S["day2_s2_missing"]} of them missing;
            the mean of the others is {S["qa_mean"]!r} °C.
        """,
            answer=f"""
            Sensor S2 recorded {S["day2_s2_n"] - S["day2_s2_missing"]} valid temperature readings on
            2024-05-02 (missing readings ignored: {S["day2_s2_missing"]}); their mean is
            {S["qa_mean"]!r} °C.

            Answer: {S["qa_mean"]!r}
        """,
        ),
    ]
    bad = [
        turn(
            analyze="I will load the readings and look at the first rows.",
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv')
            print(df.head())
        """,
        ),
        turn(
            analyze="""
            Missing values would break the average, so I will replace them with 0 and then average
            the S2 readings of 2024-05-02.
        """,
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv').fillna(0)
            sel = df[(df['sensor_id'] == 'S2') & df['timestamp'].str.startswith('2024-05-02')]
            print(round(sel['temperature_c'].mean(), 2))
        """,
        ),
        turn(
            analyze="That gives the daily mean.",
            answer=f"""
            The mean temperature of S2 on 2024-05-02 is {S["bad_mean"]!r} °C.

            Answer: {S["bad_mean"]!r}
        """,
        ),
    ]
    return good, ("missing_values_as_zero", bad)


SENSORS_CLEAN = """
    import pandas as pd
    df = pd.read_csv('readings.csv')
    n_before = len(df)
    ok = df['temperature_c'].notna() & df['temperature_c'].between(-10, 60)
    clean = df[ok].copy()
    print('rows dropped:', n_before - len(clean))
    missing_hum = clean['humidity_pct'].isna()
    clean['humidity_pct'] = clean['humidity_pct'].fillna(
        clean.groupby('sensor_id')['humidity_pct'].transform('median'))
    print('humidity values filled:', int(missing_hum.sum()))
    clean.to_csv('readings_clean.csv', index=False)
    print('rows saved:', len(clean))
    for sensor, value in clean.groupby('sensor_id')['temperature_c'].mean().items():
        print(f"{sensor}: mean temperature {value:.2f}")
"""


def traj_datatask_sensors(S):
    means = {sid: f2(S["clean_mean"][sid]) for sid, _ in SENSORS}
    report = f"""
        Cleaning summary for readings.csv ({S["n_rows"]} rows):
        - Dropped {S["dropped"]} rows: {S["n_temp_missing"]} with a missing temperature_c and
          {S["glitch_rows"]} out-of-range reading (85.0 °C from S1, a sensor glitch).
        - Filled {S["filled"]} missing humidity_pct values with the median humidity of the same sensor.
        - Saved {S["n_clean"]} rows with the original columns to readings_clean.csv.
        - Mean temperature after cleaning: S1 {means["S1"]} °C, S2 {means["S2"]} °C, S3 {means["S3"]} °C.
    """
    good = [
        turn(
            analyze="""
            Before cleaning I will inspect the data: column types, missing values per column and
            the temperature range, to spot implausible readings.
        """,
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv')
            print(df.shape)
            print(df.isna().sum())
            print(df.groupby('sensor_id')['temperature_c'].describe())
            print(df[(df['temperature_c'] < -10) | (df['temperature_c'] > 60)])
        """,
        ),
        turn(
            understand=f"""
            There are {S["n_temp_missing"]} missing temperatures, {S["n_hum_missing"]} missing
            humidity values and one implausible 85.0 °C reading from S1.
        """,
            analyze="""
            I will drop rows with a missing or out-of-range temperature, fill humidity gaps with
            the per-sensor median of the remaining rows, save the file and print the summary.
        """,
            code_src=SENSORS_CLEAN,
        ),
        turn(
            analyze="I will read the saved file back to verify it has no gaps and the same columns.",
            code_src="""
            import pandas as pd
            clean = pd.read_csv('readings_clean.csv')
            print(clean.shape)
            print(clean.columns.tolist())
            print(clean[['temperature_c', 'humidity_pct']].isna().sum())
            print(clean['temperature_c'].min(), clean['temperature_c'].max())
        """,
        ),
        turn(analyze="The cleaned file checks out; I will summarise the results.", answer=report),
    ]
    bad = [
        turn(
            analyze="I will inspect missing values and ranges first.",
            code_src="""
            import pandas as pd
            df = pd.read_csv('readings.csv')
            print(df.isna().sum())
            print(df.describe())
        """,
            fence=False,
        ),
        turn(analyze="Now I will clean and save the data.", code_src=SENSORS_CLEAN, fence=False),
        turn(analyze="The cleaning is done.", answer=report),
    ]
    return good, ("unfenced_code", bad)


def traj_datatask_retail(R):
    months = R["months"]
    lines = "\n".join(
        f"- {g}: "
        + ", ".join(f"{m} {f2(Fraction(R['pivot'][(g, m)], 100))}" for m in months)
        + f" (quarter {f2(Fraction(R['region_total'][g], 100))})"
        for g in R["regions"]
    )
    top = R["top_region"]
    good = [
        turn(
            analyze="""
            I need revenue per region and month. Region lives in stores.csv, so I will check both
            files and the date range first.
        """,
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv', parse_dates=['order_date'])
            stores = pd.read_csv('stores.csv')
            print(sales.head())
            print(stores[['store_id', 'store_name', 'region']])
            print(sales['order_date'].min(), sales['order_date'].max())
        """,
        ),
        turn(
            understand="""
            Orders run from January to March 2024 and every store_id has a region in stores.csv.
        """,
            analyze="""
            I will compute revenue, merge in the region, pivot region × month with sums, round to
            2 decimals and save summary.csv; I also print quarterly totals per region.
        """,
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv', parse_dates=['order_date'])
            stores = pd.read_csv('stores.csv')
            df = sales.merge(stores[['store_id', 'region']], on='store_id', how='left')
            df['revenue'] = df['units'] * df['unit_price']
            df['month'] = df['order_date'].dt.strftime('%Y-%m')
            pivot = df.pivot_table(index='region', columns='month', values='revenue', aggfunc='sum').round(2)
            pivot.to_csv('summary.csv')
            print(pivot)
            for region, row in pivot.iterrows():
                print(region, ', '.join(f'{m} {v:.2f}' for m, v in row.items()))
            totals = df.groupby('region')['revenue'].sum().sort_values(ascending=False)
            for region, value in totals.items():
                print(f"{region} quarter total: {value:.2f}")
        """,
        ),
        turn(
            analyze="I will confirm summary.csv was written with the expected layout.",
            code_src="""
            import pandas as pd
            print(pd.read_csv('summary.csv'))
        """,
        ),
        turn(
            analyze=f"{top} has the largest quarterly total; I will report the table.",
            answer=(
                f"Revenue (units × unit_price) by region and month, saved as summary.csv:\n"
                f"{lines}\n\n"
                f"Highest revenue over the quarter: {top} with "
                f"{f2(Fraction(R['region_total'][top], 100))}."
            ),
        ),
    ]
    bad = [
        turn(
            analyze="I will look at the sales data.",
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv')
            print(sales.head())
        """,
        ),
        turn(
            analyze="Let me try a pivot directly on the sales table.",
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv')
            sales['month'] = sales['order_date'].str[:7]
            print(sales.pivot_table(index='store_id', columns='month', values='units', aggfunc='sum'))
        """,
        ),
        turn(
            analyze="I still need the regions; I will check stores.csv.",
            code_src="""
            import pandas as pd
            stores = pd.read_csv('stores.csv')
            print(stores)
        """,
        ),
    ]
    return good, ("no_answer", bad)


INVENTORY_VALUE = """
    import pandas as pd
    products = pd.read_excel('inventory.xlsx', sheet_name='products')
    stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
    df = stock.merge(products[['sku', 'unit_cost', 'reorder_level']], on='sku', how='left')
    df['stock_value'] = df['on_hand'] * df['unit_cost']
    value = df.groupby('warehouse', as_index=False)['stock_value'].sum()
    value['stock_value'] = value['stock_value'].round(2)
    value.to_csv('warehouse_value.csv', index=False)
    for _, row in value.iterrows():
        print(f"{row['warehouse']}: {row['stock_value']:.2f}")
    print(f"total: {value['stock_value'].sum():.2f}")
"""


def traj_datatask_inventory(inv):
    vals = {w: f2(Fraction(inv["value"][w], 100)) for w in WAREHOUSES}
    wrong = {w: f2(Fraction(inv["wrong_value"][w], 100)) for w in WAREHOUSES}
    below = ", ".join(f"{s} ({name})" for s, name in zip(inv["below"], inv["below_names"], strict=True))
    good = [
        turn(
            analyze="""
            I will open both sheets of inventory.xlsx and check the columns I need: on_hand in
            'stock', unit_cost and reorder_level in 'products'.
        """,
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            print(products.head())
            print(stock.head())
            print(stock['warehouse'].value_counts())
        """,
        ),
        turn(
            analyze="""
            Stock value is on_hand × unit_cost per stock row, summed per warehouse. I will save it
            as warehouse_value.csv with columns warehouse and stock_value.
        """,
            code_src=INVENTORY_VALUE,
        ),
        turn(
            analyze="Next, SKUs whose on_hand summed over warehouses is below reorder_level.",
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            totals = stock.groupby('sku', as_index=False)['on_hand'].sum()
            merged = products.merge(totals, on='sku', how='left').fillna({'on_hand': 0})
            below = merged[merged['on_hand'] < merged['reorder_level']]
            print(below[['sku', 'product_name', 'on_hand', 'reorder_level']].to_string(index=False))
            print(len(below))
        """,
        ),
        turn(
            analyze="I have both results and will report them.",
            answer=f"""
            - Stock value (on_hand × unit_cost) per warehouse, saved as warehouse_value.csv:
              East {vals["East"]}, North {vals["North"]}, South {vals["South"]} (total
              {f2(Fraction(inv["value_total"], 100))}).
            - {len(inv["below"])} SKUs have total on-hand stock below their reorder level: {below}.
        """,
        ),
    ]
    bad = [
        turn(
            analyze="I will load the two sheets.",
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            print(products.columns.tolist(), stock.columns.tolist())
        """,
        ),
        turn(
            analyze="Stock value per warehouse from the quantity and the unit cost.",
            code_src="""
            import pandas as pd
            products = pd.read_excel('inventory.xlsx', sheet_name='products')
            stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
            df = stock.merge(products, on='sku')
            df['stock_value'] = df['reorder_level'] * df['unit_cost']
            value = df.groupby('warehouse', as_index=False)['stock_value'].sum().round(2)
            value.to_csv('warehouse_value.csv', index=False)
            print(value)
        """,
        ),
        turn(
            analyze="I will report the values.",
            answer=f"""
            Stock value per warehouse: East {wrong["East"]}, North {wrong["North"]}, South
            {wrong["South"]} (total {f2(Fraction(inv["wrong_value_total"], 100))}), saved as
            warehouse_value.csv.
        """,
        ),
    ]
    return good, ("wrong_column", bad)


CLINIC_JOIN = (
    "df = pd.read_sql_query('SELECT v.*, p.age, p.sex, p.smoker FROM visits v "
    "JOIN patients p ON v.patient_id = p.patient_id', con)"
)


def traj_openresearch_clinic(C):
    dx_sorted = sorted(C["by_dx"].items(), key=lambda kv: -kv[1][1])
    dx_text = "; ".join(f"{dx} {f2(m)} mmHg (n={n})" for dx, (n, m) in dx_sorted)
    cell1 = """
        import sqlite3
        import pandas as pd
        con = sqlite3.connect('clinic.db')
        print(pd.read_sql_query("SELECT name, sql FROM sqlite_master WHERE type = 'table'", con).to_string())
        patients = pd.read_sql_query('SELECT * FROM patients', con)
        visits = pd.read_sql_query('SELECT * FROM visits', con)
        con.close()
        print(patients.shape, visits.shape)
        print(patients.describe(include='all'))
        print(visits.head())
    """
    cell2 = """
        import sqlite3
        import pandas as pd
        con = sqlite3.connect('clinic.db')
        JOIN
        con.close()
        print(f"visits: {len(df)}, patients: {df['patient_id'].nunique()}")
        print(f"mean systolic: {df['systolic_bp'].mean():.2f}, "
              f"mean diastolic: {df['diastolic_bp'].mean():.2f}")
        high = df['systolic_bp'] >= 140
        print(f"visits with systolic >= 140: {high.sum()} ({high.mean() * 100:.1f}%)")
        by_dx = df.groupby('diagnosis')['systolic_bp'].agg(['count', 'mean'])
        by_dx = by_dx.sort_values('mean', ascending=False)
        for dx, row in by_dx.iterrows():
            print(f"{dx}: n={int(row['count'])}, mean systolic {row['mean']:.2f}")
        for smoker, value in df.groupby('smoker')['systolic_bp'].mean().items():
            print(f"smoker={smoker}: mean systolic {value:.2f}")
        for dx, value in df.groupby('diagnosis')['age'].mean().items():
            print(f"{dx}: mean patient age {value:.1f}")
        print(f"all visits: mean patient age {df['age'].mean():.1f}")
    """.replace("JOIN", CLINIC_JOIN)
    cell3 = """
        import sqlite3
        import pandas as pd
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        import seaborn as sns
        from scipy import stats
        con = sqlite3.connect('clinic.db')
        JOIN
        con.close()
        r = df['age'].corr(df['systolic_bp'])
        fit = stats.linregress(df['age'], df['systolic_bp'])
        print(f"Pearson r(age, systolic) = {r:.2f}")
        print(f"slope = {fit.slope:.2f} mmHg per year of age")
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        sns.scatterplot(data=df, x='age', y='systolic_bp', hue='smoker', ax=axes[0])
        sns.boxplot(data=df, x='diagnosis', y='systolic_bp', ax=axes[1])
        axes[1].tick_params(axis='x', rotation=30)
        fig.tight_layout()
        fig.savefig('blood_pressure.png', dpi=100)
        print('saved blood_pressure.png')
    """.replace("JOIN", CLINIC_JOIN)
    report = f"""
        Blood pressure in the clinic database ({C["n_patients"]} patients, {C["n_visits"]} visits)

        - Overall: mean systolic {f2(C["mean_sbp"])} mmHg and diastolic {f2(C["mean_dbp"])} mmHg;
          {C["high"]} visits ({f1(C["high_pct"])}%) had a systolic reading of 140 mmHg or more.
        - Age shows a strong positive association: Pearson r(age, systolic) = {float_fmt(C["r"], 2)}, and a
          linear fit gives about {f2(C["slope"])} mmHg more per year of age.
        - Smoking: smokers average {f2(C["by_smoker"][1])} mmHg systolic versus
          {f2(C["by_smoker"][0])} mmHg for non-smokers.
        - Diagnosis: {dx_text}. Hypertension visits sit clearly above routine checkups.
        - Figure: blood_pressure.png (age vs systolic coloured by smoking; systolic by diagnosis).

        Caveats: visits are repeated measures of the same patients and the groups are small, so
        these are descriptive associations, not causal effects. Age and diagnosis are confounded:
        hypertension and type 2 diabetes visits come from older patients (mean age
        {f1(C["dx_age"]["Hypertension"])} and {f1(C["dx_age"]["Type 2 diabetes"])} versus
        {f1(C["mean_age"])} over all visits).
    """
    good = [
        turn(
            analyze="""
            I will start by listing the tables in clinic.db with their schema and getting a first
            look at patients and visits.
        """,
            code_src=cell1,
        ),
        turn(
            understand="""
            'patients' has age, sex, smoker (0/1) and city; 'visits' has systolic_bp, diastolic_bp,
            heart_rate and diagnosis per visit, linked by patient_id.
        """,
            analyze="""
            I will join the tables and describe blood pressure overall, by diagnosis and by smoking
            status.
        """,
            code_src=cell2,
        ),
        turn(
            analyze="""
            Now the relation with age: correlation, a simple linear fit, and a figure combining a
            scatter plot and a box plot by diagnosis.
        """,
            code_src=cell3,
        ),
        turn(analyze="I have the numbers and the figure; I will write the report.", answer=report),
    ]
    bad = [
        turn(analyze="Look at the database tables.", code_src=cell1, fence=False),
        turn(analyze="Describe blood pressure by group.", code_src=cell2, fence=False),
        turn(analyze="Write the report.", answer=report),
    ]
    return good, ("unfenced_code", bad)


def traj_openresearch_retail(R):
    total = R["total"]
    cats = sorted(R["cat_rev"], key=lambda c: -R["cat_rev"][c])
    cat_text = "; ".join(
        f"{c} {f2(Fraction(R['cat_rev'][c], 100))} ({f1(Fraction(R['cat_rev'][c] * 100, total))}%, "
        f"{R['cat_n'][c]} orders)"
        for c in cats
    )
    month_text = ", ".join(f"{m} {f2(Fraction(R['month_rev'][m], 100))}" for m in R["months"])
    sids = sorted(R["store_rev"], key=lambda s: -R["store_rev"][s])
    store_text = "; ".join(
        f"{R['store_by_id'][s][1]} {f2(Fraction(R['store_rev'][s], 100))} "
        f"(average order {f2(Fraction(R['store_rev'][s], 100 * R['store_n'][s]))})"
        for s in sids
    )
    best, worst = sids[0], sids[-1]
    name = {s: R["store_by_id"][s][1] for s in sids}
    avg = {s: Fraction(R["store_rev"][s], 100 * R["store_n"][s]) for s in sids}
    top_avg = max(sids, key=lambda s: avg[s])
    elec_share = Fraction(R["store_cat_rev"][(top_avg, "Electronics")], R["store_rev"][top_avg])
    # the report's store narrative below is only true for these facts
    assert max(sids, key=lambda s: R["store_n"][s]) == best and top_avg == sids[1]
    assert R["store_cat_rev"][(worst, "Electronics")] == 0
    assert R["store_n"][worst] == min(R["store_n"].values())
    assert sorted(avg.values())[len(avg) // 2 - 1] < avg[best]
    cell2 = """
        import pandas as pd
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        sales = pd.read_csv('sales.csv', parse_dates=['order_date'])
        sales['revenue'] = sales['units'] * sales['unit_price']
        total = sales['revenue'].sum()
        print(f"total revenue: {total:.2f} from {len(sales)} orders")
        by_cat = sales.groupby('category')['revenue'].agg(['sum', 'count'])
        by_cat = by_cat.sort_values('sum', ascending=False)
        for cat, row in by_cat.iterrows():
            print(f"{cat}: {row['sum']:.2f} ({row['sum'] / total * 100:.1f}%), {int(row['count'])} orders")
        monthly = sales.groupby(sales['order_date'].dt.strftime('%Y-%m'))['revenue'].sum()
        for month, value in monthly.items():
            print(f"{month}: {value:.2f}")
        ax = by_cat['sum'].plot(kind='bar', title='Revenue by category, Q1 2024')
        ax.set_ylabel('revenue')
        plt.tight_layout()
        plt.savefig('revenue_by_category.png', dpi=100)
    """
    cell3 = """
        import pandas as pd
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        sales = pd.read_csv('sales.csv')
        stores = pd.read_csv('stores.csv')
        sales['revenue'] = sales['units'] * sales['unit_price']
        per_store = sales.groupby('store_id', as_index=False).agg(
            revenue=('revenue', 'sum'), orders=('order_id', 'count'))
        per_store = per_store.merge(stores, on='store_id')
        per_store['avg_order'] = per_store['revenue'] / per_store['orders']
        per_store = per_store.sort_values('revenue', ascending=False)
        for _, row in per_store.iterrows():
            print(f"{row['store_name']} ({row['region']}): revenue {row['revenue']:.2f}, "
                  f"orders {row['orders']}, average order {row['avg_order']:.2f}")
        mix = pd.crosstab(sales['store_id'], sales['category'], values=sales['revenue'],
                          aggfunc='sum', normalize='index')
        print(mix.round(2))
        per_store.plot(x='store_name', y='revenue', kind='barh', legend=False, title='Revenue by store')
        plt.tight_layout()
        plt.savefig('revenue_by_store.png', dpi=100)
    """
    report = f"""
        Revenue drivers, Q1 2024 ({R["n_orders"]} orders, total revenue {f2(Fraction(total, 100))})

        - Category mix dominates: {cat_text}. {cats[0]} carries the largest share of revenue with
          few, expensive orders, while {max(R["cat_n"], key=lambda c: R["cat_n"][c])} is the most
          frequent category.
        - Months: {month_text}.
        - Stores: {store_text}.
        - {name[best]} leads because it has the most orders ({R["store_n"][best]}) at an
          above-median order value. {name[top_avg]} comes second with only {R["store_n"][top_avg]}
          orders thanks to the highest average order ({f2(avg[top_avg])}): Electronics make up
          {f2(elec_share)} of its revenue. {name[worst]} trails with {R["store_n"][worst]} orders
          and no Electronics sales at all, so the category mix explains much of the gap between
          stores.
        - Charts: revenue_by_category.png and revenue_by_store.png.

        Caveats: one quarter of data and {R["n_orders"]} orders only, so month-to-month changes
        and store rankings are noisy.
    """
    good = [
        turn(
            analyze="""
            I will load sales.csv and stores.csv, check their shapes, types and the stores'
            attributes.
        """,
            code_src=RETAIL_LOAD,
        ),
        turn(
            understand="""
            Each sales row is one order with units and unit_price; revenue has to be computed.
            stores.csv adds region and floor area per store.
        """,
            analyze="""
            First the overall picture: total revenue, revenue and order counts by category, and
            monthly totals, with a bar chart saved to a file.
        """,
            code_src=cell2,
        ),
        turn(
            analyze="""
            Next the store level: revenue, order counts, average order value and each store's
            category mix, with a second chart.
        """,
            code_src=cell3,
        ),
        turn(analyze="I have category, month and store figures; I will write the report.", answer=report),
    ]
    bad = [
        turn(
            analyze="Revenue by store and category.",
            code_src="""
            import pandas as pd
            sales = pd.read_csv('sales.csv')
            print(sales.groupby(['store_id', 'category'])['revenue'].sum())
        """,
        ),
        turn(
            analyze="The data is clear enough; I will write the report.",
            answer="""
            Revenue is driven mainly by Electronics and by the largest store, Lakeshore Market,
            which generates about 40% of all revenue. Revenue grew by roughly 15% every month and
            the South region is the strongest. Stores should expand their electronics ranges.
        """,
        ),
    ]
    return good, ("exception_then_unsupported_answer", bad)


def build_trajectories(R, inv, C, S):
    makers = [
        ("qa-retail-001", traj_qa_retail, R),
        ("qa-inventory-001", traj_qa_inventory, inv),
        ("qa-clinic-001", traj_qa_clinic, C),
        ("qa-sensors-001", traj_qa_sensors, S),
        ("datatask-sensors-001", traj_datatask_sensors, S),
        ("datatask-retail-001", traj_datatask_retail, R),
        ("datatask-inventory-001", traj_datatask_inventory, inv),
        ("openresearch-clinic-001", traj_openresearch_clinic, C),
        ("openresearch-retail-001", traj_openresearch_retail, R),
    ]
    records = []
    for task_id, maker, facts in makers:
        good, (kind, bad) = maker(facts)
        records.append({"task_id": task_id, "label": "good", "kind": "reference", "turns": good})
        records.append({"task_id": task_id, "label": "bad", "kind": kind, "turns": bad})
    return records


# --------------------------------------------------------------------------------------------
def generate(out: Path) -> None:
    out = Path(out)
    R = build_retail(out)
    inv = build_inventory(out)
    C = build_clinic(out)
    S = build_sensors(out)
    tasks = build_tasks(R, inv, C, S)
    for name, records in tasks.items():
        write_jsonl(out / "tasks" / f"{name}.jsonl", records)
    write_jsonl(out / "trajectories.jsonl", build_trajectories(R, inv, C, S))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=str(HERE), help="output folder (default: the data/ folder holding this script)"
    )
    args = parser.parse_args(argv)
    generate(Path(args.out))
    print(f"wrote shipped data under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
