"""Issue 48 item 6, "charts a reader reads at a glance", as checks over a page drawn in Chromium:
no blank chart, no legend over the plot area, no unformatted number in a table or on an axis."""

from __future__ import annotations

import re

# Per drawn Plotly chart: its title, how many values its traces draw, where its legend and plot area
# sit on the screen, and its tick labels; per table cell (st.table, st.dataframe's accessible grid):
# its column header and text.
_PAGE_JS = """
() => {
    const strip = s => (s || '').replace(/<[^>]+>/g, '');
    const drawn = v => v !== null && v !== undefined && v !== '' && !(typeof v === 'number' && !isFinite(v));
    const charts = Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
        const L = g._fullLayout || {};
        let values = 0;
        for (const t of (g._fullData || [])) {
            if (t.visible === false) continue;
            if (t.z) for (const row of Array.from(t.z)) values += Array.from(row || []).filter(drawn).length;
            else if (t.values || t.labels) values += Array.from(t.values || t.labels).filter(drawn).length;
            else values += Array.from(t.y || t.x || []).filter(drawn).length;
        }
        const svg = g.querySelector('.main-svg');
        const legend = L.showlegend ? g.querySelector('.legend') : null;
        const box = svg ? svg.getBoundingClientRect() : null;
        const s = L._size || {};
        return {
            title: strip(L.title && L.title.text),
            values: values,
            width: box ? box.width : 0,
            plot: box ? {left: box.left + s.l, top: box.top + s.t, right: box.left + s.l + s.w,
                         bottom: box.top + s.t + s.h} : null,
            legend: legend ? (r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom}))(
                legend.getBoundingClientRect()) : null,
            ticks: Array.from(g.querySelectorAll('.xtick text, .ytick text')).map(t => t.textContent),
        };
    });
    const cells = [];
    for (const t of document.querySelectorAll('[data-testid=stTable] table, [data-testid=stDataFrame] table')) {
        const head = Array.from(t.querySelectorAll('thead th')).map(h => h.textContent.trim());
        // st.dataframe's accessible grid holds the raw value, not the column's display format
        const raw = t.closest('[data-testid=stDataFrame]') !== null;
        for (const r of t.querySelectorAll('tbody tr')) {
            Array.from(r.querySelectorAll('td, th')).forEach((c, j) =>
                cells.push({column: head[j] || '', text: c.textContent.trim(), raw: raw}));
        }
    }
    return {charts, cells};
}
"""

_NUMBER = re.compile(r"[-−]?\d+(?:\.(\d+))?")
_SEPARATED = re.compile(r"[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def unformatted(text: str, separators: bool = True) -> bool:
    """A number as a program prints it rather than a reader wants it: 10,000 and up without
    thousands separators (unless ``separators`` is False: a grid that shows a raw value formatted
    by its column), or more than 3 significant decimals (7978.5628; 0.000123 is fine)."""
    text = text.strip().rstrip("%").strip()
    if _SEPARATED.fullmatch(text):
        decimals = text.partition(".")[2]
        return len(decimals) > 3
    match = _NUMBER.fullmatch(text)
    if match is None:
        return False
    whole, _, decimals = text.lstrip("-−").partition(".")
    if len(whole) > 4 and separators:
        return True
    if int(whole) == 0:
        return len(decimals.lstrip("0")) > 3
    return len(decimals) > 3


def _overlap(a: dict, b: dict) -> float:
    """The area two screen boxes share."""
    w = min(a["right"], b["right"]) - max(a["left"], b["left"])
    h = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return max(w, 0) * max(h, 0)


def _beside(legend: dict, plot: dict) -> bool:
    """A legend at the plot's side (not in a row above or under it): its width is the plot's loss."""
    return legend["top"] < plot["bottom"] and legend["bottom"] > plot["top"]


def problems(tab, where: str = "") -> list[str]:
    """What keeps the open page from reading at a glance, one line each (empty: none)."""
    # a dataframe draws on a canvas; its accessible grid, which these checks read, comes a moment later
    tab.wait_for_function(
        "() => Array.from(document.querySelectorAll('[data-testid=stDataFrame]')).every(d => d.querySelector('table'))",
        timeout=30_000,
    )
    found = tab.evaluate(_PAGE_JS)
    out = []
    for chart in found["charts"]:
        name = f"{where}{chart['title'] or '(untitled chart)'}"
        if chart["values"] == 0:
            out.append(f"{name}: blank (no value drawn)")
        if chart["legend"] and chart["plot"] and _overlap(chart["legend"], chart["plot"]) > 0:
            out.append(f"{name}: the legend lies over the plot area")
        elif chart["legend"] and chart["width"] and _beside(chart["legend"], chart["plot"]):
            share = (chart["legend"]["right"] - chart["legend"]["left"]) / chart["width"]
            if share > 0.35:
                out.append(f"{name}: the legend takes {share:.0%} of the chart's width")
        raw = sorted({t for t in chart["ticks"] if unformatted(t)})
        if raw:
            out.append(f"{name}: unformatted axis ticks {raw[:5]}")
    raw_cells: dict[str, set[str]] = {}
    for cell in found["cells"]:
        if unformatted(cell["text"], separators=not cell["raw"]):
            raw_cells.setdefault(cell["column"], set()).add(cell["text"])
    for column, texts in raw_cells.items():
        out.append(f"{where}table column {column!r}: unformatted numbers {sorted(texts)[:3]}")
    return out
