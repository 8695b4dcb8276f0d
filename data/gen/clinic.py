"""Workspace ``clinic`` (``clinic.db`` with tables ``patients`` and ``visits``, written
byte-stably), its facts, and the reference trajectories of the clinic tasks (qa, openresearch).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sqlite3
import struct
import tempfile
from fractions import Fraction
from pathlib import Path

from .common import (
    f1,
    f2,
    float_fmt,
    mean,
    rounded,
    turn,
    write_bytes,
)

# Written into bytes 96..99 of the SQLite header ("SQLITE_VERSION_NUMBER of the library that
# most recently modified the file"), so the file does not record the local SQLite build.
SQLITE_HEADER_VERSION = 3040001


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
# reference trajectories
# --------------------------------------------------------------------------------------------
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
