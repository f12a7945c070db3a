"""The placement line of a split target: where each layer lives and what a pass sends and receives."""

from __future__ import annotations

from ondevice.sizes import format_bytes


def split_line(split) -> str:
    t = split.traffic()
    if not t or not t.get("verify_passes"):
        return split.describe()
    return (f"{split.describe()}; per verification pass {format_bytes(t['bytes_sent_per_pass'])} sent, "
            f"{format_bytes(t['bytes_received_per_pass'])} received over the network "
            f"({t['segments_out_per_pass']:.0f} / {t['segments_in_per_pass']:.0f} TCP segments)")
