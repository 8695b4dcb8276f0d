"""The real tables the bank is built from, where each comes from and what its package says about it.

Every table ships inside a package of the ``kernel`` extra, so nothing is downloaded. A table
is read through its package's own loader, then lightly prepared (an index turned into a
column, codes stored as integers, a date column for time series) so that the written files are
ordinary tables. ``TableSpec`` also says which columns the task families may use: ``numeric``
(measurements), ``categorical`` (few levels, for group-bys and tests), ``label`` (one name per
row) and ``time`` (a date or year column). The licence/copyright text is what the package
itself carries (statsmodels' ``COPYRIGHT``; scikit-learn's DESCR source lines), recorded
verbatim in the manifest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from deepanalyze_env.offline.bank import BankError

Split = Literal["train", "dev", "test"]


@dataclass(frozen=True)
class TimeSpec:
    """The time axis of a table that has one (column, kind, spacing), for time-series families."""

    column: str
    kind: Literal["date", "year"]
    freq: str  # "W", "M", "Q" or "Y": the spacing of the rows, for the question text


@dataclass(frozen=True)
class TableSpec:
    """A real table shipped inside an installed package: where it comes from, how to load it, its split
    and which columns families may use — so the bank needs no download."""

    name: str
    package: str  # the distribution the table ships in
    module: str  # what must be importable to load it
    dataset: str  # the dataset's name inside the package
    split: Split
    prepare: Callable[[], Any]  # -> pandas.DataFrame
    numeric: tuple[str, ...]
    categorical: tuple[str, ...] = ()
    label: str | None = None
    time: TimeSpec | None = None
    extra: str = "kernel"  # the pip extra that provides the package
    notes: str = ""

    def load(self):
        try:
            importlib.import_module(self.module)
        except ImportError:
            raise BankError(
                f"table {self.name!r} needs the {self.package} package: "
                f"pip install 'deepanalyze-env[{self.extra}]'"
            ) from None
        return self.prepare()


@dataclass
class SourceInfo:
    """Provenance of one table as built (package version, licence, shape, split), written into the
    manifest so a task can be traced to its data."""

    table: str
    package: str
    version: str
    dataset: str
    title: str
    licence: str
    source: str
    rows: int
    columns: int
    split: str
    extra: str = "kernel"
    column_names: list[str] = field(default_factory=list)


def _sm(name: str):
    return importlib.import_module(f"statsmodels.datasets.{name}")


def _sm_frame(name: str, int_cols: tuple[str, ...] = ()):
    df = _sm(name).load_pandas().data.copy()
    for col in int_cols:
        df[col] = df[col].astype("int64")
    return df.reset_index(drop=True)


def _quarter_dates(df):
    import pandas as pd

    years = df["year"].astype(int)
    months = (df["quarter"].astype(int) - 1) * 3 + 1
    return pd.to_datetime({"year": years, "month": months, "day": 1}).dt.strftime("%Y-%m-%d")


def _macrodata():
    df = _sm_frame("macrodata", ("year", "quarter"))
    df.insert(0, "date", _quarter_dates(df))
    return df


def _interest_inflation():
    df = _sm_frame("interest_inflation", ("year", "quarter"))
    df.insert(0, "date", _quarter_dates(df))
    return df


def _dated(name: str, rename: dict[str, str] | None = None):
    df = _sm(name).load_pandas().data.copy()
    df.index.name = "date"
    df = df.reset_index()
    df["date"] = df["date"].dt.strftime("%Y-%m-%d")
    return df.rename(columns=rename or {})


def _elnino():
    import pandas as pd

    wide = _sm_frame("elnino")
    months = [c for c in wide.columns if c != "YEAR"]
    long = wide.melt(id_vars="YEAR", value_vars=months, var_name="month", value_name="sst")
    long["month_no"] = long["month"].map({m: i for i, m in enumerate(months, 1)})
    long = long.sort_values(["YEAR", "month_no"]).reset_index(drop=True)
    dates = pd.to_datetime({"year": long["YEAR"].astype(int), "month": long["month_no"], "day": 1})
    return pd.DataFrame({"date": dates.dt.strftime("%Y-%m-%d"), "sst": long["sst"]})


def _yearly(name: str, year_col: str):
    df = _sm_frame(name)
    df[year_col] = df[year_col].astype("int64")
    return df


def _statecrime():
    df = _sm(name="statecrime").load_pandas().data.copy()
    df.index.name = "state"
    return df.reset_index()


def _fertility():
    df = _sm_frame("fertility")
    keep = ["Country Name", "Country Code", "1970", "1980", "1990", "2000", "2010", "2013"]
    return df[keep]


def _sk(loader: str, target: str, names: bool = True, **kwargs):
    from sklearn import datasets

    bunch = getattr(datasets, loader)(as_frame=True, **kwargs)
    df = bunch.frame.copy()
    if names and hasattr(bunch, "target_names"):
        df["target"] = [str(bunch.target_names[i]) for i in df["target"]]
    return df.rename(columns={"target": target})


def _diabetes():
    df = _sk("load_diabetes", "progression", names=False, scaled=False)
    df["sex"] = df["sex"].astype("int64")
    return df


def _linnerud():
    import pandas as pd
    from sklearn import datasets

    bunch = datasets.load_linnerud(as_frame=True)
    return pd.concat([bunch.data, bunch.target], axis=1)


def _breast_cancer():
    df = _sk("load_breast_cancer", "diagnosis")
    return df[[c for c in df.columns if c.startswith("mean ")] + ["diagnosis"]]


def _sm_spec(
    name, split, numeric, categorical=(), label=None, time=None, prepare=None, int_cols=None, notes=""
):
    cats = tuple(categorical) if int_cols is None else tuple(int_cols)
    return TableSpec(
        name=name,
        package="statsmodels",
        module="statsmodels",
        dataset=name,
        split=split,
        prepare=prepare or (lambda: _sm_frame(name, cats)),
        numeric=tuple(numeric),
        categorical=tuple(categorical),
        label=label,
        time=time,
        notes=notes,
    )


def _sk_spec(name, dataset, split, prepare, numeric, categorical=(), notes=""):
    return TableSpec(
        name=name,
        package="scikit-learn",
        module="sklearn",
        dataset=dataset,
        split=split,
        prepare=prepare,
        numeric=tuple(numeric),
        categorical=tuple(categorical),
        notes=notes,
    )


# The split is fixed per table (not drawn), so that adding a table never moves another one
# between splits; dev and test each get tables with categories and time series.
TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        # ---------------------------------------------------------------- train
        _sm_spec(
            "anes96",
            "train",
            ("popul", "TVnews", "age", "income"),
            ("PID", "educ", "vote", "selfLR"),
            int_cols=("PID", "educ", "vote", "selfLR", "TVnews", "age", "income"),
        ),
        _sm_spec(
            "fair",
            "train",
            ("affairs", "age", "yrs_married", "children"),
            ("rate_marriage", "religious", "educ", "occupation"),
            int_cols=("rate_marriage", "religious", "educ", "occupation", "occupation_husb"),
        ),
        _sm_spec(
            "randhie",
            "train",
            ("mdvis", "lncoins", "lpi", "fmde", "physlm", "disea"),
            ("idp", "hlthg", "hlthf", "hlthp"),
            int_cols=("idp", "hlthg", "hlthf", "hlthp"),
        ),
        _sm_spec("grunfeld", "train", ("invest", "value", "capital"), ("firm",), int_cols=("year",)),
        _sm_spec(
            "macrodata",
            "train",
            ("realgdp", "realcons", "realinv", "cpi", "m1", "tbilrate", "unemp", "infl"),
            ("quarter",),
            time=TimeSpec("date", "date", "Q"),
            prepare=_macrodata,
        ),
        _sm_spec(
            "co2",
            "train",
            ("co2",),
            time=TimeSpec("date", "date", "W"),
            prepare=lambda: _dated("co2"),
            notes="weekly series with missing weeks",
        ),
        _sm_spec(
            "elec_equip",
            "train",
            ("turnover_index",),
            time=TimeSpec("date", "date", "M"),
            prepare=lambda: _dated("elec_equip", {"STS.M.I7.W.TOVT.NS0016.4.000": "turnover_index"}),
        ),
        _sm_spec(
            "danish_data",
            "train",
            ("lrm", "lry", "lpy", "ibo", "ide"),
            time=TimeSpec("date", "date", "Q"),
            prepare=lambda: _dated("danish_data"),
        ),
        _sm_spec(
            "star98",
            "train",
            ("NABOVE", "NBELOW", "LOWINC", "PERASIAN", "PERBLACK", "PERHISP", "AVYRSEXP", "PTRATIO"),
        ),
        _sm_spec("committee", "train", ("BILLS104", "SIZE", "SUBS", "STAFF", "BILLS103"), ("PRESTIGE",)),
        _sm_spec("copper", "train", ("WORLDCONSUMPTION", "COPPERPRICE", "INCOMEINDEX", "ALUMPRICE")),
        _sm_spec("strikes", "train", ("duration", "iprod")),
        _sm_spec(
            "fertility",
            "train",
            ("1970", "1980", "1990", "2000", "2010", "2013"),
            label="Country Name",
            prepare=_fertility,
            notes="births per woman; real missing values",
        ),
        _sk_spec(
            "breast_cancer",
            "breast_cancer",
            "train",
            _breast_cancer,
            ("mean radius", "mean texture", "mean perimeter", "mean area", "mean smoothness"),
            ("diagnosis",),
            notes="the ten 'mean …' features and the diagnosis",
        ),
        _sk_spec(
            "diabetes",
            "diabetes",
            "train",
            _diabetes,
            ("age", "bmi", "bp", "s1", "s2", "s5", "progression"),
            ("sex",),
            notes="unscaled features (scaled=False)",
        ),
        _sk_spec(
            "linnerud",
            "linnerud",
            "train",
            _linnerud,
            ("Chins", "Situps", "Jumps", "Weight", "Waist", "Pulse"),
        ),
        # ---------------------------------------------------------------- dev
        _sm_spec("ccard", "dev", ("AVGEXP", "AGE", "INCOME"), ("OWNRENT",), int_cols=("OWNRENT",)),
        _sm_spec(
            "sunspots",
            "dev",
            ("SUNACTIVITY",),
            time=TimeSpec("YEAR", "year", "Y"),
            prepare=lambda: _yearly("sunspots", "YEAR"),
        ),
        _sk_spec(
            "wine",
            "wine",
            "dev",
            lambda: _sk("load_wine", "cultivar"),
            (
                "alcohol",
                "malic_acid",
                "ash",
                "magnesium",
                "total_phenols",
                "flavanoids",
                "color_intensity",
                "proline",
            ),
            ("cultivar",),
        ),
        _sm_spec(
            "interest_inflation",
            "dev",
            ("Dp", "R"),
            ("quarter",),
            time=TimeSpec("date", "date", "Q"),
            prepare=_interest_inflation,
        ),
        _sm_spec("heart", "dev", ("survival", "age"), ("censors",), int_cols=("censors",)),
        _sm_spec("scotland", "dev", ("YES", "COUTAX", "UNEMPF", "MOR", "ACT", "GDP", "AGE")),
        _sm_spec(
            "longley",
            "dev",
            ("TOTEMP", "GNPDEFL", "GNP", "UNEMP", "ARMED", "POP"),
            time=TimeSpec("YEAR", "year", "Y"),
            prepare=lambda: _yearly("longley", "YEAR"),
        ),
        _sm_spec("cancer", "dev", ("cancer", "population")),
        # ---------------------------------------------------------------- test
        _sm_spec(
            "statecrime",
            "test",
            ("violent", "murder", "hs_grad", "poverty", "single", "white", "urban"),
            label="state",
            prepare=_statecrime,
        ),
        _sm_spec("spector", "test", ("GPA", "TUCE"), ("PSI", "GRADE"), int_cols=("PSI", "GRADE")),
        _sm_spec(
            "nile",
            "test",
            ("volume",),
            time=TimeSpec("year", "year", "Y"),
            prepare=lambda: _yearly("nile", "year"),
        ),
        _sk_spec(
            "iris",
            "iris",
            "test",
            lambda: _sk("load_iris", "species"),
            ("sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"),
            ("species",),
        ),
        _sm_spec(
            "modechoice",
            "test",
            ("ttme", "invc", "invt", "gc", "hinc"),
            ("mode", "choice", "psize"),
            int_cols=("individual", "mode", "choice", "psize"),
        ),
        _sm_spec("elnino", "test", ("sst",), time=TimeSpec("date", "date", "M"), prepare=_elnino),
        _sm_spec("engel", "test", ("income", "foodexp")),
        _sm_spec("stackloss", "test", ("STACKLOSS", "AIRFLOW", "WATERTEMP", "ACIDCONC")),
        _sm_spec(
            "cpunish",
            "test",
            ("EXECUTIONS", "INCOME", "PERPOVERTY", "PERBLACK", "VC100k96"),
            ("SOUTH",),
            int_cols=("SOUTH",),
        ),
    )
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe(spec: TableSpec, frame) -> SourceInfo:
    """Package, version, dataset, licence text and shape of one prepared table."""
    version = importlib.metadata.version(spec.package)
    if spec.package == "statsmodels":
        mod = _sm(spec.dataset)
        title = _one_line(getattr(mod, "TITLE", spec.dataset))
        licence = _one_line(getattr(mod, "COPYRIGHT", "")) or "(no copyright text in the package)"
        source = _one_line(getattr(mod, "SOURCE", ""))
    else:
        from sklearn import datasets

        loader = getattr(datasets, f"load_{spec.dataset}")
        descr = loader().DESCR
        title = _one_line(descr.splitlines()[2] if len(descr.splitlines()) > 2 else spec.dataset)
        keys = (":Creator:", ":Donor:", ":Date:", "Source URL", "UCI", "Source:")
        lines = [_one_line(line) for line in descr.splitlines() if any(k in line for k in keys)]
        package_licence = (
            importlib.metadata.metadata("scikit-learn").get("License-Expression") or "BSD-3-Clause"
        )
        licence = (
            "No data licence is stated in the package; distributed with scikit-learn "
            f"(package licence {package_licence})."
        )
        source = " ".join(lines[:4]) or "(no source lines in the DESCR)"
    return SourceInfo(
        table=spec.name,
        package=spec.package,
        version=version,
        dataset=spec.dataset,
        title=title,
        licence=licence,
        source=source[:400],
        rows=int(frame.shape[0]),
        columns=int(frame.shape[1]),
        split=spec.split,
        extra=spec.extra,
        column_names=[str(c) for c in frame.columns],
    )
