"""How the pages show a table of numbers: thousands separated (7,978.6) and at most 3 decimals
(3 significant ones below 1), the same in the data as on the screen."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st


def readable(values: pd.Series) -> pd.Series:
    """Floats rounded to 3 decimals, or to 3 significant digits below 1 (0.000123 stays)."""
    if not pd.api.types.is_float_dtype(values):
        return values
    magnitude = np.floor(np.log10(values.abs().where(values.abs() > 0)))
    digits = (2 - magnitude).clip(lower=0, upper=12).fillna(3).where(values.abs() < 1, 3)
    return pd.Series([round(v, int(d)) if pd.notna(v) else v for v, d in zip(values, digits)], index=values.index)


def dataframe(df: pd.DataFrame, column_config: dict | None = None, **kwargs) -> None:
    """``st.dataframe`` of ``df`` with its numbers readable; ``column_config`` entries win."""
    numbers = {
        str(c): st.column_config.NumberColumn(format="localized")
        for c in df.columns
        if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
    }
    st.dataframe(df.apply(readable), column_config={**numbers, **(column_config or {})}, **kwargs)
