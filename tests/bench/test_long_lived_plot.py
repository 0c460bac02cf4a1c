"""bench/long_lived.py's picture: each family's curve over the rounds, a thin line per seed and the mean over seeds,
names escaped (a family's name is data)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from bench.long_lived import plot_svg

SVG = "{http://www.w3.org/2000/svg}"


def test_each_family_has_a_line_per_seed_and_a_mean_line_through_every_round() -> None:
    labels = ["start", "coin 1", "quest <1>"]
    rows = [
        {"labels": labels, "rates": {"x/coin": [0.0, 1.0, 0.5], "x/<q>": [0.5, 0.5, None]}},
        {"labels": labels[:2], "rates": {"x/coin": [0.5, 0.5], "x/<q>": [0.5, 0.0]}},
    ]
    root = ET.fromstring(plot_svg(rows, width=240, height=160))
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2 * 3  # per family: two seeds and the mean
    coin_mean = [tuple(map(float, p.split(","))) for p in lines[2].get("points").split()]
    assert len(coin_mean) == 3  # rounds 0 and 1 from both seeds, round 2 from the one that reached it
    top, bottom = 16, 160 - 56
    assert [y for _, y in coin_mean] == [
        bottom - (bottom - top) * 0.25,  # mean of 0.0 and 0.5
        bottom - (bottom - top) * 0.75,
        bottom - (bottom - top) * 0.5,
    ]
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "quest <1>" in texts and any(t and "<q>" in t for t in texts)  # parsed back: escaped in the file
