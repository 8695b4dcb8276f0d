"""Workspace ``inventory`` (``inventory.xlsx`` with sheets ``products`` and ``stock``, written
byte-stably), its facts, and the reference trajectories of the inventory tasks (qa, datatask).
"""

from __future__ import annotations

import datetime as dt
import io
import random
import re
import zipfile
from fractions import Fraction
from pathlib import Path

import openpyxl

from .common import (
    cents,
    f2,
    turn,
    write_bytes,
)

FIXED_TIME = dt.datetime(2024, 1, 1, 0, 0, 0)
ZIP_TIME = (2024, 1, 1, 0, 0, 0)


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
# reference trajectories
# --------------------------------------------------------------------------------------------
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
