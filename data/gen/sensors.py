"""Workspace ``sensors`` (``readings.csv``: hourly, three sensors, a few gaps and one glitch), its
facts, and the reference trajectories of the sensors tasks (qa, datatask).
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

from .common import (
    f2,
    mean,
    rounded,
    tenths,
    turn,
    write_csv,
)

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
# reference trajectories
# --------------------------------------------------------------------------------------------
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
