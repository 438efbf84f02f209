"""app.tables: numbers in the pages' tables as a reader wants them (issue 48 item 6)."""

import pandas as pd

from app.tables import readable


def test_floats_keep_three_decimals_or_three_significant_digits_below_one():
    got = readable(pd.Series([7978.5628, 5.289249569, 0.17089, 0.000123456, 0.0, None, -2.71828]))
    assert got.tolist()[:5] == [7978.563, 5.289, 0.171, 0.000123, 0.0]
    assert pd.isna(got.iloc[5]) and got.iloc[6] == -2.718


def test_integers_and_text_pass_unchanged():
    ints, text = pd.Series([19208, 1, 0]), pd.Series(["world", "tp[0-1]"])
    assert readable(ints).tolist() == [19208, 1, 0] and readable(ints).dtype == ints.dtype
    assert readable(text).tolist() == ["world", "tp[0-1]"]
