"""Byte sizes as users write them ("6GiB", "500MB", "1.5G") and as we print them ("412 MB").

IEC units (KiB, MiB, GiB, TiB) and bare letters (K, M, G, T, as in `dd` and docker) are powers of
1024; SI units (KB, MB, GB, TB) are powers of 1000.
"""

from __future__ import annotations

import re

from ondevice.errors import OndeviceError

_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", start=1):
    _UNITS[_letter] = _UNITS[_letter + "ib"] = 1024**_i
    _UNITS[_letter + "b"] = 1000**_i


def parse_size(text: str | int) -> int:
    """'6GiB' → 6442450944, '500MB' → 500000000, '1.5G' → 1610612736, 4096 → 4096."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m[2].lower()
    if not m or unit not in _UNITS:
        raise OndeviceError(f"Cannot read the size {text!r}; write it like '6GiB', '500MB' or '1.5G'.")
    return int(float(m[1]) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """412_000_000 → '412 MB' (SI, like ollama)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(n)} B"
