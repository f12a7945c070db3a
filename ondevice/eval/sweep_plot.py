"""The memory sweep as a picture: tok/s against the memory limit, one line per series, the physical
bound dashed, the limits where the target fits in RAM shaded. Plain SVG, no plotting library.

    write_svg(json.loads(Path("sweep.json").read_text()), Path("sweep.svg"))   # eval/memory_sweep.py
"""

from __future__ import annotations

from pathlib import Path

WIDTH, HEIGHT = 820, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 210, 36, 56  # margins around the plot area
COLORS = {"llama-cpp": "#888888", "target": "#1f77b4", "default": "#d62728", "bound": "#d62728"}
LABELS = {"llama-cpp": "llama-cpp-python alone", "target": "ondevice, target alone", "default": "ondevice default",
          "bound": "disk bound of the default"}  # fmt: skip


STREAMED_SHARE = 0.1  # a pass reading less of the target file than this is bound by its compute: no disk bound drawn


def bound(point: dict, disk_gbps: float, target_bytes: float = 0.0) -> float | None:
    """tokens per pass × disk bandwidth ÷ bytes read per pass: the fastest a streamed answer can be.
    None where the answer hardly streams (the file nearly fits: a few MB a pass would put the bound
    at hundreds of tok/s, far above what the pass's compute allows)."""
    read = point.get("bytes_read_per_pass")
    if not read or read < max(1e6, STREAMED_SHARE * target_bytes) or point.get("target_in_ram"):
        return None
    return point["tokens_per_pass"] * disk_gbps * 1e9 / read


def series_points(record: dict) -> dict[str, list[tuple[float, float]]]:
    """Series → [(limit in GB, tok/s)] of the points that ran; the no-limit point sits one step right of the largest limit."""
    limits = sorted({p["limit_gb"] for p in record["points"] if p["limit_gb"] is not None})
    step = (limits[-1] - limits[-2]) if len(limits) > 1 else 0.2
    x_of = lambda p: p["limit_gb"] if p["limit_gb"] is not None else limits[-1] + step  # noqa: E731
    out: dict[str, list[tuple[float, float]]] = {}
    for p in record["points"]:
        if "error" not in p and p.get("tokens_per_second"):
            out.setdefault(p["series"], []).append((x_of(p), p["tokens_per_second"]))
        b = bound(p, record["disk_gbps"], record.get("target_bytes", 0.0)) if p["series"] == "default" and "error" not in p else None
        if b is not None:
            out.setdefault("bound", []).append((x_of(p), b))
    return {k: sorted(v) for k, v in out.items()}


def write_svg(record: dict, path: Path) -> None:
    lines = series_points(record)
    xs = [x for pts in lines.values() for x, _ in pts]
    if not xs:
        return
    x_lo, x_hi = min(xs), max(xs)
    y_hi = max(y for pts in lines.values() for _, y in pts) * 1.1
    sx = lambda x: LEFT + (x - x_lo) / max(x_hi - x_lo, 1e-9) * (WIDTH - LEFT - RIGHT)  # noqa: E731
    sy = lambda y: HEIGHT - BOTTOM - y / y_hi * (HEIGHT - TOP - BOTTOM)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>']  # fmt: skip
    in_ram = [p for p in record["points"] if p["series"] == "target" and p.get("target_in_ram") and p["limit_gb"] is not None]
    if in_ram:  # from the smallest limit where the target fits, shaded
        x0 = sx(min(p["limit_gb"] for p in in_ram))
        parts.append(f'<rect x="{x0:.1f}" y="{TOP}" width="{WIDTH - RIGHT - x0:.1f}" height="{HEIGHT - TOP - BOTTOM}" fill="#eef6ee"/>')
        parts.append(f'<text x="{x0 + 4:.1f}" y="{TOP + 14}" fill="#4a7a4a">the target fits in RAM</text>')
    parts += axes(record, x_lo, x_hi, y_hi, sx, sy)
    for k, (name, pts) in enumerate(sorted(lines.items(), key=lambda kv: list(LABELS).index(kv[0]))):
        dash = ' stroke-dasharray="6,4"' if name == "bound" else ""
        path_d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
        parts.append(f'<path d="{path_d}" fill="none" stroke="{COLORS[name]}" stroke-width="2"{dash}/>')
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{COLORS[name]}"/>' for x, y in pts if name != "bound"]
        y = TOP + 10 + 18 * k
        parts.append(f'<line x1="{WIDTH - RIGHT + 12}" y1="{y}" x2="{WIDTH - RIGHT + 32}" y2="{y}" stroke="{COLORS[name]}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{WIDTH - RIGHT + 36}" y="{y + 4}">{LABELS[name]}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def axes(record: dict, x_lo: float, x_hi: float, y_hi: float, sx, sy) -> list[str]:
    """Axes, ticks at each limit (the no-limit point labelled RAM) and every 2 tok/s, and the title."""
    base, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [f'<line x1="{LEFT}" y1="{base}" x2="{right}" y2="{base}" stroke="black"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}" stroke="black"/>']  # fmt: skip
    limits = sorted({p["limit_gb"] for p in record["points"] if p["limit_gb"] is not None})
    for x in limits:
        out.append(f'<text x="{sx(x):.1f}" y="{base + 16}" text-anchor="middle">{x:g}</text>')
    if any(p["limit_gb"] is None for p in record["points"]):
        out.append(f'<text x="{sx(x_hi):.1f}" y="{base + 16}" text-anchor="middle">RAM</text>')
    step = 2 if y_hi > 8 else 1
    for y in range(0, int(y_hi) + 1, step):
        out.append(f'<line x1="{LEFT - 4}" y1="{sy(y):.1f}" x2="{right}" y2="{sy(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 8}" y="{sy(y) + 4:.1f}" text-anchor="end">{y}</text>')
    out.append(f'<text x="{(LEFT + right) / 2:.0f}" y="{HEIGHT - 14}" text-anchor="middle">memory limit (GB, cgroup)</text>')
    out.append(f'<text x="16" y="{(TOP + base) / 2:.0f}" transform="rotate(-90 16 {(TOP + base) / 2:.0f})" text-anchor="middle">tokens per second</text>')
    title = f"{record.get('target', 'target')} ({record.get('target_bytes', 0) / 1e9:.2f} GB), {record['prompts']}, {record['max_tokens']} tokens, disk {record['disk_gbps']:.2f} GB/s, {record['date']}"
    out.append(f'<text x="{LEFT}" y="20">{title}</text>')
    return out
