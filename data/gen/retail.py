"""Workspace ``retail`` (``sales.csv``, ``stores.csv``): its seeded data, the facts the tasks
ask about, and the reference trajectories of the retail tasks (qa, datatask, openresearch).
"""

from __future__ import annotations

import datetime as dt
import random
from fractions import Fraction
from pathlib import Path

from .common import (
    cents,
    f1,
    f2,
    turn,
    write_csv,
)

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
# reference trajectories
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
