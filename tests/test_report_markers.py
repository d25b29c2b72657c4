"""How the figures tell settings apart: a storage kind by its marker, a method's presets over one kind by
fill (budget and RULER figures) or by annotation (the memory figure), and a protocol every compressed run
shares said once in the caption."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports import lines, pareto


def test_points_of_one_colour_and_marker_are_annotated_apart():
    """Presets of one method (KVzip, KVzip (layerwise)) and its decode-time run share its colour and,
    over one storage kind, its marker: their annotations carry the words that differ; a method over
    another kind (its own marker) and a method alone keep the budget alone."""
    points = pd.DataFrame(
        [
            ("kvzip", "none", "KVzip"),
            ("kvzip", "none", "KVzip (layerwise)"),
            ("tova", "none", "TOVA query_aware=false"),
            ("tova", "none", "TOVA query_aware=false decode-time"),
            ("tova", "int8", "TOVA quant=int8 query_aware=false"),
            ("snapkv", "none", "SnapKV"),
        ],
        columns=["method", "quant", "label"],
    )
    assert pareto.told_apart(points) == {
        "KVzip": "",
        "KVzip (layerwise)": "(layerwise)",
        "TOVA query_aware=false": "",
        "TOVA query_aware=false decode-time": "decode-time",
    }


def test_with_quantized_storage_a_line_marker_names_the_storage_kind_and_presets_differ_in_fill():
    """Over quantized storage the marker is the storage kind's for every method (the RULER and budget
    figures as the memory figure), a method's second preset over one kind half-filled, and the
    caption names the markers; without quantized storage, markers stay per preset and no caption."""
    rows = [
        ("kvzip", "none", "KVzip"),
        ("kvzip", "none", "KVzip (layerwise)"),
        ("snapkv", "none", "SnapKV"),
        ("snapkv", "int8", "SnapKV quant=int8"),
        ("fullkv", "kivi2", "FullKV quant=kivi2"),
    ]
    part = pd.DataFrame(
        [(m, q, label, 0.5, 10.0 + i, np.nan, np.nan, 3, False) for i, (m, q, label) in enumerate(rows)],
        columns=["method", "quant", "label", "budget", "mean", "ci_low", "ci_high", "n", "budget_realised"],
    )
    fig, ax = plt.subplots()
    note = lines.draw_lines(ax, part)
    drawn = {ln.get_label().rsplit(" (", 1)[0]: (ln.get_marker(), ln.get_fillstyle()) for ln in ax.lines}
    assert drawn == {
        "KVzip": ("o", "full"),
        "KVzip (layerwise)": ("o", "left"),
        "SnapKV": ("o", "full"),
        "SnapKV quant=int8": ("s", "full"),
        "FullKV quant=kivi2": ("v", "full"),
    }
    assert note.startswith("KV storage (quant=): circle none, square int8, triangle down kivi2.")
    assert "Half-filled" in note
    ax.clear()
    plain = part[part["quant"] == "none"]
    assert lines.draw_lines(ax, plain) == ""
    assert [line.get_marker() for line in ax.lines] == ["o", "s", "o"]  # per preset: KVzip's second a square
    plt.close(fig)


def test_the_memory_figure_says_once_that_every_compressed_run_is_query_agnostic():
    points = pd.DataFrame(
        [("fullkv", "FullKV"), ("fullkv", "FullKV quant=int8"), ("tova", "TOVA query_aware=false")],
        columns=["method", "label"],
    )
    stripped, agnostic = pareto.shared_protocol(points)
    assert agnostic and list(stripped["label"]) == ["FullKV", "FullKV quant=int8", "TOVA"]
    mixed = pd.concat([points, pd.DataFrame([("snapkv", "SnapKV")], columns=["method", "label"])])
    same, agnostic = pareto.shared_protocol(mixed)  # a query-aware run: the tags tell them apart
    assert not agnostic and list(same["label"]) == list(mixed["label"])
