"""The placement line of a split target: where each layer lives and what a pass sends and receives."""

from __future__ import annotations

from ondevice.sizes import format_bytes


def split_line(split) -> str:
    t = split.traffic()
    if not t or not t.get("verify_passes"):
        return split.describe()
    line = (f"{split.describe()}; per verification pass ({t['mean_tokens_per_pass']:.1f} tokens on average) "
            f"{t['round_trips_per_pass']:.1f} round trips, {format_bytes(t['bytes_sent_per_pass'])} sent, "
            f"{format_bytes(t['bytes_received_per_pass'])} received over the network")
    if "bytes_received_per_token" in t:
        line += f" (received: {format_bytes(max(0, t['bytes_received_fixed']))} + {format_bytes(t['bytes_received_per_token'])} a token)"
    return line
