"""The roofline in the HTML report: an inline log-log SVG of each op with known costs against the
ceilings of its dtype, and the roofline columns of the op table.

The ops and ceilings are made here with known values (an op at 10 FLOP/byte and 1 TFLOP/s, ceilings
of 19.5 TFLOP/s and 900 GB/s), so positions are checked against the axis the chart draws.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis.render import html, html_roofline
from analysis.render.html_roofline_chart import si
from html_checks import EVIL, _pixels_drawn, assert_self_contained

NAN = math.nan
CEILINGS = {
    "float32": {"matrix_flops_per_second": 19.5e12, "vector_flops_per_second": 1.2e12, "memory_bytes_per_second": 9e11},
    "bfloat16": {"matrix_flops_per_second": 312e12, "vector_flops_per_second": 2.4e12, "memory_bytes_per_second": 9e11},
}
# op, type, kind, dtype, ms per step, FLOP/s, FLOP/byte, bound, % of ceiling
COSTED = [
    ("model/conv2d_1/Conv2D", "Conv2D", "matrix", "float32", 4.0, 1e12, 10.0, "memory", 100 * 1e12 / 9e12),
    ("model/dense/MatMul", "MatMul", "matrix", "bfloat16", 2.0, 2e13, 200.0, "memory", 100 * 2e13 / 1.8e14),
    ("model/re_lu/Relu", "Relu", "vector", "bfloat16", 1.0, 5e10, 0.25, "memory", 100 * 5e10 / 2.25e11),
    (f"model/{EVIL}/Add", f"Add{EVIL}", "vector", "float32", 0.5, 1e11, 1.0, "memory", 100 * 1e11 / 9e11),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    trace = fx.write_synthetic_device_trace(
        tmp_path_factory.mktemp("gpu") / "logs" / "plugins" / "profile" / "s" / "host.xplane.pb"
    )
    return analysis.analyze(trace.path)


def cost_ops() -> pd.DataFrame:
    """Six ops: four with known costs, a reshape with no arithmetic, one with unknown costs."""
    rows = []
    for op, kind_type, kind, dtype, ms, fps, intensity, bound, pct in COSTED:
        flops = fps * ms / 1000
        rows.append(
            {
                "op": op,
                "type": kind_type,
                "device": "/device:GPU:0",
                "count_per_step": 1.0,
                "ms_per_step": ms,
                "dtype": dtype,
                "flops_per_step": flops,
                "bytes_per_step": flops / intensity,
                "flops_per_second": fps,
                "bytes_per_second": fps / intensity,
                "intensity": intensity,
                "bound": bound,
                "ceiling_pct": pct,
                "kind": kind,
                "kernel": f"kernel_{kind_type}",
            }
        )
    rows.append(
        {
            "op": "model/flatten/Reshape",
            "type": "Reshape",
            "device": "/device:GPU:0",
            "count_per_step": 1.0,
            "ms_per_step": 0.3,
            "dtype": "float32",
            "flops_per_step": 0.0,
            "bytes_per_step": 8192.0,
            "flops_per_second": 0.0,
            "bytes_per_second": 8192.0 / 0.0003,
            "intensity": 0.0,
            "bound": "",
            "ceiling_pct": NAN,
            "kind": "",
            "kernel": "",
        }
    )
    rows.append(
        {
            "op": "model/unknown/Custom",
            "type": "Custom",
            "device": "/device:GPU:0",
            "count_per_step": 1.0,
            "ms_per_step": 0.2,
            "dtype": "",
            "flops_per_step": NAN,
            "bytes_per_step": NAN,
            "flops_per_second": NAN,
            "bytes_per_second": NAN,
            "intensity": NAN,
            "bound": "",
            "ceiling_pct": NAN,
            "kind": "",
            "kernel": "",
        }
    )
    ops = pd.DataFrame(rows)
    ops["compute_pct"] = 100 * ops["ms_per_step"] / ops["ms_per_step"].sum()
    return ops


def with_roofline(result, ops: pd.DataFrame, roofline: dict | None):
    """`result` with these ops and `Analysis.roofline` (set on the instance where the field is not declared)."""
    out = dataclasses.replace(result, ops=ops)
    if any(f.name == "roofline" for f in dataclasses.fields(out)):
        return dataclasses.replace(out, roofline=roofline)
    object.__setattr__(out, "roofline", roofline)
    return out


def roofline_info(ceilings=CEILINGS, source="run.json peak") -> dict:
    return {
        "ceilings": ceilings,
        "ceilings_source": source,
        "flops_per_step": 4.275e9,
        "model_flops_per_step": 4.2e9,
        "known_time_pct": 97.0,
        "notes": [],
    }


def svg_of(page: str) -> str:
    section = page[page.index('id="roofline"') :]
    section = section[: section.index("</section>")]
    assert section.count("<svg") == 1, "one roofline chart"
    return section[section.index("<svg") : section.index("</svg>")]


def points(svg: str) -> list[tuple[str, float, float, float]]:
    """(tooltip, cx, cy, r) of each op drawn."""
    found = re.findall(
        r'<g class="op"><title>(.*?)</title><circle cx="([\d.]+)" cy="([\d.]+)" r="([\d.]+)"', svg, re.DOTALL
    )
    return [(title, float(cx), float(cy), float(r)) for title, cx, cy, r in found]


def ticks(svg: str, axis: str) -> dict[str, float]:
    """Tick label -> its position on the chart (x for the x axis, y for the y axis)."""
    coordinate = "x1" if axis == "x" else "y1"
    found = re.findall(
        rf'<g class="tick-{axis}"><line {"" if axis == "x" else "x1=[^ ]+ x2=[^ ]+ "}'
        rf'{coordinate}="([\d.]+)"[^>]*/><text[^>]*>([^<]*)</text>',
        svg,
    )
    return {text: float(position) for position, text in found}


def log_position(value: float, low: tuple[float, float], high: tuple[float, float]) -> float:
    """Where `value` lies between two ticks (value, position) of a log axis."""
    (a, pa), (b, pb) = low, high
    return pa + (pb - pa) * (math.log10(value) - math.log10(a)) / (math.log10(b) - math.log10(a))


def test_si_prefixes():
    assert si(19.5e12, "FLOP/s") == "19.5 TFLOP/s"
    assert si(9e11, "B/s") == "900 GB/s"
    assert si(999.96e9, "FLOP/s") == "1 TFLOP/s"
    assert si(1e9, "FLOP/s") == "1 GFLOP/s" and si(0.25, "") == "250 m"


def test_one_point_per_op_with_known_costs_area_as_time(base):
    page = html.render_analysis(with_roofline(base, cost_ops(), roofline_info()))
    assert_self_contained(page)
    drawn = points(svg_of(page))
    assert len(drawn) == len(COSTED)  # the reshape (no arithmetic) and the unknown op are not drawn
    ms = {op: row[4] for op, *rest in COSTED for row in [(op, *rest)]}
    by_name = {}
    for title, _, _, r in drawn:
        name = next(op for op in ms if html.esc(op) in title)
        by_name[name] = r
    areas = np.array([math.pi * by_name[op] ** 2 for op in ms])
    times = np.array(list(ms.values()))
    assert np.allclose(areas / times, areas[0] / times[0], rtol=1e-3)  # area proportional to ms per step
    assert list(np.argsort(-areas)) == list(np.argsort(-times))


def test_positions_land_where_the_axes_say(base):
    svg = svg_of(html.render_analysis(with_roofline(base, cost_ops(), roofline_info())))
    x_ticks, y_ticks = ticks(svg, "x"), ticks(svg, "y")
    conv = next(p for p in points(svg) if "conv2d_1" in p[0])
    assert conv[1] == pytest.approx(x_ticks["10"], abs=0.02)  # 10 FLOP/byte
    assert conv[2] == pytest.approx(y_ticks["1 TFLOP/s"], abs=0.02)  # 1 TFLOP/s
    relu = next(p for p in points(svg) if "re_lu" in p[0])  # 0.25 FLOP/byte, 50 GFLOP/s: between ticks
    assert relu[1] == pytest.approx(log_position(0.25, (0.1, x_ticks["0.1"]), (1, x_ticks["1"])), abs=0.02)
    assert relu[2] == pytest.approx(
        log_position(5e10, (1e10, y_ticks["10 GFLOP/s"]), (1e11, y_ticks["100 GFLOP/s"])), abs=0.02
    )
    assert y_ticks["1 TFLOP/s"] < y_ticks["100 GFLOP/s"]  # up is faster


def test_ceiling_lines_per_dtype(base):
    page = html.render_analysis(with_roofline(base, cost_ops(), roofline_info()))
    svg = svg_of(page)
    y_ticks, x_ticks = ticks(svg, "y"), ticks(svg, "x")
    roofs = dict(re.findall(r'<g class="roof" data-dtype="([^"]+)">(.*?)</g>', svg, re.DOTALL))
    assert sorted(roofs) == ["bfloat16", "float32"]
    for dtype, roof in roofs.items():
        flats = dict(re.findall(r'<line class="(matrix|vector)" x1="[\d.]+" y1="([\d.]+)"', roof))
        assert sorted(flats) == ["matrix", "vector"], roof
        for kind, y in flats.items():
            value = CEILINGS[dtype][f"{kind}_flops_per_second"]
            low = 10 ** math.floor(math.log10(value))
            expected = log_position(
                value, (low, y_ticks[si(low, "FLOP/s")]), (10 * low, y_ticks[si(10 * low, "FLOP/s")])
            )
            assert float(y) == pytest.approx(expected, abs=0.02), (dtype, kind)
        line = re.search(r'<line class="memory" x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"', roof)
        assert line is not None
        x1, y1, x2, y2 = map(float, line.groups())
        # The memory slope: y = 900 GB/s x intensity at both ends, read back through the axes.
        decade_x = x_ticks["10"] - x_ticks["1"]
        decade_y = y_ticks["100 GFLOP/s"] - y_ticks["1 TFLOP/s"]
        for x, y in ((x1, y1), (x2, y2)):
            intensity = 10 ** ((x - x_ticks["1"]) / decade_x)
            flops = 10 ** (12 + (y_ticks["1 TFLOP/s"] - y) / decade_y)
            assert flops == pytest.approx(9e11 * intensity, rel=1e-3)
        # It rises to the highest ridge: 312 TFLOP/s / 900 GB/s for bfloat16.
        ridge = max(CEILINGS[dtype][k] for k in ("matrix_flops_per_second", "vector_flops_per_second")) / 9e11
        assert 10 ** ((x2 - x_ticks["1"]) / decade_x) == pytest.approx(ridge, rel=1e-3)
    labels = re.findall(r'<text class="ceiling"[^>]*>([^<]*)</text>', svg)
    assert {
        "float32 matrix 19.5 TFLOP/s",
        "float32 vector 1.2 TFLOP/s",
        "bfloat16 matrix 312 TFLOP/s",
        "bfloat16 vector 2.4 TFLOP/s",
        "memory 900 GB/s",
    } <= set(labels)
    assert "Ceilings from run.json peak." in page and "ceilings are unknown" not in page


@pytest.mark.parametrize(
    "info",
    [
        None,
        {"ceilings": {}, "ceilings_source": None},
        {
            "ceilings": {
                "float32": {
                    "matrix_flops_per_second": NAN,
                    "vector_flops_per_second": NAN,
                    "memory_bytes_per_second": NAN,
                }
            },
            "ceilings_source": None,
        },
    ],
    ids=["none", "empty", "nan"],
)
def test_unknown_ceilings_draw_the_points_and_say_how_to_give_them(base, info):
    if info is not None:  # the analysis' own note on it is not said twice
        info = {**info, "notes": ["compute ceilings unknown: no measured peak", "costs from 1 program"]}
    page = html.render_analysis(with_roofline(base, cost_ops(), info))
    svg = svg_of(page)
    assert len(points(svg)) == len(COSTED)
    assert "no measured peak" not in page and ("Costs from 1 program." in page) == (info is not None)
    assert '<line class="matrix"' not in svg and '<line class="memory"' not in svg
    section = page[page.index('id="roofline"') :]
    missing = re.search(r'<p class="missing">([^<]*)</p>', section)
    assert missing is not None
    sentence = missing.group(1)
    assert sentence.startswith("The ceilings are unknown")
    for how in ("devprof peak", "--measure-peak", "devprof analyze --peak-tflops", "--peak-file"):
        assert how in sentence
    assert "roofs" not in section[: section.index("</section>")]  # nothing said of roofs not drawn


def test_a_partly_unknown_ceiling_is_named(base):
    ceilings = {"float32": {**CEILINGS["float32"], "memory_bytes_per_second": NAN}, "bfloat16": CEILINGS["bfloat16"]}
    page = html.render_analysis(with_roofline(base, cost_ops(), roofline_info(ceilings)))
    assert "Unknown ceilings (float32 memory bandwidth)" in page
    found = re.search(r'<g class="roof" data-dtype="float32">(.*?)</g>', svg_of(page), re.DOTALL)
    assert found is not None
    roof = found.group(1)
    assert '<line class="matrix"' in roof and '<line class="memory"' not in roof


def test_no_chart_without_costs(base):
    bare = base.ops[
        [c for c in base.ops.columns if c in ("op", "type", "device", "count_per_step", "ms_per_step", "compute_pct")]
    ]
    for ops in (base.ops, bare):  # the trace's own ops (no costs), with or without the roofline columns
        page = html.render_analysis(with_roofline(base, ops, getattr(base, "roofline", None)))
        section = page[page.index('id="roofline"') :]
        section = section[: section.index("</section>")]
        assert "<svg" not in section
        assert (
            "No roofline: no traced op has known FLOPs and bytes (they come from the run&#x27;s op_costs.csv, "
            "recorded at capture, or from HLO shapes in the trace, and neither gave any)." in section
        )
    unknown = cost_ops().assign(
        flops_per_step=NAN, bytes_per_step=NAN, flops_per_second=NAN, intensity=NAN, ceiling_pct=NAN, bound=""
    )
    page = html.render_analysis(with_roofline(base, unknown, roofline_info()))
    section = page[page.index('id="roofline"') :]
    assert "<svg" not in section[: section.index("</section>")] and "No roofline: no traced op has known" in section


def test_hostile_op_names_are_escaped_in_the_chart_and_its_tooltips(base):
    page = html.render_analysis(with_roofline(base, cost_ops(), roofline_info()))
    assert_self_contained(page)
    assert EVIL not in page
    svg = svg_of(page)
    escaped = html.esc(EVIL)
    hostile = [title for title, *_ in points(svg) if escaped in title]
    assert len(hostile) == 1 and f"Add{escaped}" in hostile[0]  # its name and its type, escaped
    labels = re.findall(r'<tspan class="op-label"[^>]*>([^<]*)</tspan>', svg)
    assert "model/&lt;…&gt;alert(…)&lt;…&gt;/Add" in labels, labels  # labelled (shortened), escaped
    assert all(len(label.replace("&lt;", "<").replace("&gt;", ">").replace("&#x27;", "'")) <= 30 for label in labels)


def test_the_least_efficient_ops_are_labelled_first(base):
    """Labels go to the ops with the most time at the lowest share of their ceiling: six busy ops near their
    ceiling are not named, a lighter one at 1 % of it is."""
    ops = cost_ops()
    relu = ops.iloc[2].to_dict()
    extra = [{**relu, "op": f"model/busy_{i}/Relu", "ms_per_step": 3.0, "ceiling_pct": 99.9} for i in range(6)]
    extra.append({**relu, "op": "model/slow_lazy/Relu", "ms_per_step": 0.8, "ceiling_pct": 1.0})
    ops = pd.concat([ops, pd.DataFrame(extra)], ignore_index=True)
    svg = svg_of(html.render_analysis(with_roofline(base, ops, roofline_info())))
    labels = re.findall(r'<tspan class="op-label"[^>]*>([^<]*)</tspan>', svg)
    assert len(labels) == html_roofline.LABELLED_OPS == 5
    assert "model/slow_lazy/Relu" in labels and not any("busy" in label for label in labels), labels
    assert len(points(svg)) == len(COSTED) + 7


def test_ops_table_has_the_roofline_columns(base):
    page = html.render_analysis(with_roofline(base, cost_ops(), roofline_info()))
    section = page[page.index('id="ops"') :]
    section = section[: section.index("</section>")]
    head = re.findall(r"<th>([^<]*)</th>", section)
    assert head[-4:] == ["FLOP/s", "FLOP/byte", "bound", "% of ceiling"]
    assert "flops_per_step" not in head and "kernel" not in head
    rows = re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>")[1])
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert cells[0][-4:] == ["1 T", "10", "memory", "11.1"]  # the conv: 1 TFLOP/s at 10 FLOP/byte
    assert cells[-1][-4:] == ["", "", "", ""]  # unknown costs: blank
    assert '<td class="n">1 T</td>' in rows[0]  # figures right-aligned
    assert "conv2d_1/<wbr>" in rows[0]  # names still wrap only after / and ::


def test_ops_table_without_costs_is_unchanged(base):
    page = html.render_analysis(base)  # the trace's own ops: no costs, so no roofline column
    section = page[page.index('id="ops"') :]
    head = re.findall(r"<th>([^<]*)</th>", section[: section.index("</section>")])
    assert head[:6] == ["op", "type", "device", "count_per_step", "ms_per_step", "compute_pct"]
    assert not {"FLOP/s", "FLOP/byte", "bound", "% of ceiling", "flops_per_step", "dtype", "kernel"} & set(head)


@pytest.mark.slow
def test_roofline_report_opens_in_chromium(base, tmp_path):
    import browser

    path = with_roofline(base, cost_ops(), roofline_info()).to_html(tmp_path / "roofline.html")
    loaded = browser.load(path, width=1400, boxes=("#roofline svg",))
    assert loaded.errors == [] and loaded.requests == [], (loaded.errors, loaded.requests)
    box = loaded.boxes["#roofline svg"]
    assert box is not None and box["height"] > 300
    assert _pixels_drawn(loaded.screenshot, box) > 0.01


def test_no_ceiling_warning_for_integer_ops_or_a_sliver_of_the_time(base):
    """A 0.006 ms int64 op asked for a ceiling devprof peak never measures."""
    ops = cost_ops()
    tiny = ops.iloc[[0]].assign(op="model/index/Cast", type="Cast", dtype="int64", ms_per_step=0.006)
    page = html.render_analysis(with_roofline(base, pd.concat([ops, tiny], ignore_index=True), roofline_info()))
    assert "Unknown ceilings" not in page and "int64" not in page.split('class="missing"')[-1][:400]
    sliver = ops.iloc[[0]].assign(op="model/half/Op", dtype="float16", ms_per_step=0.001)
    page = html.render_analysis(with_roofline(base, pd.concat([ops, sliver], ignore_index=True), roofline_info()))
    assert "Unknown ceilings" not in page
    bulk = ops.iloc[[0]].assign(op="model/half/Op", dtype="float16", ms_per_step=5.0)
    page = html.render_analysis(with_roofline(base, pd.concat([ops, bulk], ignore_index=True), roofline_info()))
    assert "Unknown ceilings (float16 (none given))" in page


# Each text of the roofline that some other element covers, as Chromium hit-tests it at the centre of each glyph.
COVERED_TEXTS = """(() => {
  const covered = [];
  for (const text of document.querySelectorAll('#roofline svg text')) {
    text.scrollIntoView({block: 'center'});
    const matrix = text.getScreenCTM();
    for (let i = 0; i < text.getNumberOfChars(); i++) {
      const box = text.getExtentOfChar(i);
      const at = new DOMPoint(box.x + box.width / 2, box.y + box.height / 2).matrixTransform(matrix);
      const hit = document.elementFromPoint(at.x, at.y);
      if (hit && !text.contains(hit)) {
        covered.push(text.textContent + ' under a ' + hit.tagName + ' (' + (hit.parentNode.className.baseVal || '') + ')');
        break;
      }
    }
  }
  return covered;
})()"""


@pytest.mark.slow
def test_no_roofline_label_is_under_a_circle(base, tmp_path):
    """Busy ops crowd the memory slope where its label is written and each other's numbers: every
    label is drawn above every circle."""
    import browser

    ops = cost_ops()
    relu = ops.iloc[2].to_dict()
    crowd = [
        {
            **relu,
            "op": f"model/crowd_{i}/Relu",
            "intensity": intensity,
            "ms_per_step": ms,
            "flops_per_second": 9e11 * intensity * share,
            "ceiling_pct": 100 * share,
        }
        for i, (intensity, ms, share) in enumerate(
            [(0.5, 3.0, 0.9), (0.6, 0.4, 0.3), (0.7, 2.0, 0.5), (0.55, 1.5, 0.2), (0.9, 4.0, 0.95), (1.2, 0.6, 0.1)]
        )
    ]
    ops = pd.concat([ops, pd.DataFrame(crowd)], ignore_index=True)
    path = with_roofline(base, ops, roofline_info()).to_html(tmp_path / "crowded.html")
    loaded = browser.load(path, width=1000, evaluate=(COVERED_TEXTS,))
    assert loaded.errors == [], loaded.errors
    assert loaded.values[COVERED_TEXTS] == []
