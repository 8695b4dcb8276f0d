"""The task files (``tasks/{qa,datatask,openresearch}.jsonl``) built from the workspaces' facts, and
the list of reference trajectories: one good and one labelled bad per task.
"""

from __future__ import annotations

from fractions import Fraction

from .clinic import traj_openresearch_clinic, traj_qa_clinic
from .common import f2
from .inventory import WAREHOUSES, traj_datatask_inventory, traj_qa_inventory
from .retail import traj_datatask_retail, traj_openresearch_retail, traj_qa_retail
from .sensors import SENSORS, traj_datatask_sensors, traj_qa_sensors


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
