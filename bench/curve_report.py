#!/usr/bin/env python3
"""bench/curve.sh's summary: a Markdown table of medians by server and
object count, and, given a directory, the two figures as SVG
(curve-throughput.svg: Lease renewals/s against objects; curve-memory.svg:
resident bytes per object against objects), both with a log-scale x axis.

Usage: curve_report.py RUNS.jsonl [FIGURE_DIR]
"""

import json
import math
import statistics
import sys
from pathlib import Path

COLOURS = {"ephd": "#1f77b4", "etcd-3.6": "#d62728"}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs):
    rows = {}
    for r in runs:
        if r.get("failed"):
            continue
        row = rows.setdefault((r["server"], r["objects"]), {})
        phase = r["phase"]
        if phase == "load":
            grown = (r["rss_kb"] - r["rss_base_kb"]) * 1024
            row.setdefault("bytes_per_object", []).append(grown / r["objects"])
            # Key plus value bytes of one object, as ephd-bench reports them.
            row.setdefault("raw_bytes", []).append(r["key_size"] + r["val_size"])
        elif phase == "renew":
            row.setdefault("renew_per_s", []).append(r["ops_per_s"])
            row.setdefault("renew_p99_ms", []).append(r["lat_p99_ms"])
            if r.get("server_cpu_s") and r.get("ops"):
                row.setdefault("cpu_us", []).append(r["server_cpu_s"] / r["ops"] * 1e6)
        elif phase == "list":
            row.setdefault("list_p50_ms", []).append(r["lat_p50_ms"])
    return {key: {k: median(v) for k, v in row.items()} for key, row in rows.items()}


def fmt(value, spec):
    return "–" if value is None else format(value, spec)


def table(summary):
    lines = [
        "| server | objects | bytes per object (raw) | resident / raw | renewals/s | renewal p99 ms | server CPU µs/renewal | paged list of as many 1 KiB objects, p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (server, n), row in sorted(summary.items(), key=lambda kv: (kv[0][0] != "ephd", kv[0][0], kv[0][1])):
        raw = row.get("raw_bytes")
        per = row.get("bytes_per_object")
        ratio = None if per is None or not raw else per / raw
        lines.append(
            f"| {server} | {n:,} | {fmt(per, ',.0f')} ({fmt(raw, '.0f')}) | {fmt(ratio, '.2f')}× | "
            f"{fmt(row.get('renew_per_s'), ',.0f')} | {fmt(row.get('renew_p99_ms'), '.2f')} | "
            f"{fmt(row.get('cpu_us'), '.1f')} | {fmt(row.get('list_p50_ms'), ',.0f')} |"
        )
    return "\n".join(lines)


def svg(summary, key, title, unit):
    """A line chart of `key` against the object count, one line per server."""
    width, height, left, right, top, bottom = 640, 360, 80, 150, 40, 50
    series = {}
    for (server, n), row in summary.items():
        if row.get(key) is not None:
            series.setdefault(server, []).append((n, row[key]))
    points = [p for s in series.values() for p in s]
    if not points:
        return None
    xs = [math.log10(n) for n, _ in points]
    x0, x1 = math.floor(min(xs)), math.ceil(max(xs))
    if x0 == x1:
        x1 += 1
    y1 = max(v for _, v in points) * 1.1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(n):
        return left + (math.log10(n) - x0) / (x1 - x0) * plot_w

    def py(v):
        return top + plot_h - v / y1 * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
    ]
    for e in range(x0, x1 + 1):
        x = px(10**e)
        out.append(f'<line x1="{x}" y1="{top + plot_h}" x2="{x}" y2="{top + plot_h + 5}" stroke="black"/>')
        out.append(f'<text x="{x}" y="{top + plot_h + 18}" text-anchor="middle">{10**e:,}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">objects held</text>')
    for i in range(6):
        v = y1 * i / 5
        y = py(v)
        out.append(f'<line x1="{left - 5}" y1="{y}" x2="{left + plot_w}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{v:,.0f}</text>')
    out.append(
        f'<text x="18" y="{top + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {top + plot_h / 2})">{unit}</text>'
    )
    for row, (server, pts) in enumerate(sorted(series.items())):
        colour = COLOURS.get(server, "#555")
        pts.sort()
        path = " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for n, v in pts:
            out.append(f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>')
        ly = top + 10 + row * 18
        out.append(f'<line x1="{left + plot_w + 15}" y1="{ly}" x2="{left + plot_w + 35}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{left + plot_w + 40}" y="{ly + 4}">{server}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    failed = [r for r in runs if r.get("failed")]
    summary = summarize(runs)
    print(table(summary))
    for r in failed:
        print(f"\nfailed: {r['phase']} on {r['server']} with {r['objects']:,} objects (exit {r['rc']})")
    if len(sys.argv) > 2:
        figures = Path(sys.argv[2])
        figures.mkdir(parents=True, exist_ok=True)
        for name, key, title, unit in (
            ("curve-throughput.svg", "renew_per_s", "Node Lease renewals per second", "renewals/s"),
            ("curve-memory.svg", "bytes_per_object", "Resident bytes per node Lease object", "bytes per object"),
        ):
            drawn = svg(summary, key, title, unit)
            if drawn:
                (figures / name).write_text(drawn)


if __name__ == "__main__":
    main()
