"""What the single-site bench scripts share (``bench/site_agreement``,
``bench/layout_study``): the labels measured in both metrics, from labels tables.

Imported after ``_venv`` (the repository on the path)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def confirmed(dirs: list[Path]) -> pd.DataFrame:
    """The measured wall-time retests of exact labels (each carrying its cycles effect), from
    every ``<program>/sites.csv`` under ``dirs``; exits with one line when there is none."""
    tables = [pd.read_csv(f) for d in dirs for f in sorted(d.glob("*/sites.csv"))]
    if not tables:
        sys.exit(f"{', '.join(map(str, dirs))}: no <program>/sites.csv")
    df = pd.concat(tables, ignore_index=True)
    both = df[(df.trial == "retest") & (df.status == "measured") & (df.metric == "time")
              & df.cycles_effect.notna()]
    return both.reset_index(drop=True)
