"""Placement math (offload/placement.py): which layers stay on the device (decoded or kept
encoded), stream from RAM, or come from disk, within the budgets; and the sizes budgets are written
in. The expected numbers are worked out by hand in the comments."""

from __future__ import annotations

import pytest

from ondevice.errors import OndeviceError
from ondevice.offload.placement import Placement, plan_placement
from ondevice.sizes import parse_size

MB = 10**6


@pytest.mark.parametrize(
    "text, expected",
    [
        ("6GiB", 6 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5G", 3 * 2**29),
        ("4096", 4096),
        (" 2 kb ", 2000),
        ("512MiB", 2**29),
        (77, 77),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1GB", "1.5.3G", "12 parsecs", "GB", "1e9"])
def test_parse_size_rejects(text):
    with pytest.raises(OndeviceError, match="Cannot read the size"):
        parse_size(text)


def uniform_plan(**kwargs) -> Placement:
    """28 layers of 50 MB on the device, 15 MB as transferred; 300 MB resident minimum."""
    return plan_placement([50 * MB] * 28, 300 * MB, transfer_bytes=[15 * MB] * 28, device="cuda", **kwargs)


def test_everything_fits():
    p = uniform_plan(device_budget=300 * MB + 28 * 50 * MB, ram_budget="1GB")
    assert p.on_device == tuple(range(28)) and p.streamed == ()
    assert p.describe() == "28 layers: 28 on GPU, 0 streamed from RAM, 0 from disk; 0 B moved per pass"


def test_streaming_split():
    # floor = 300 resident + 2 ring slots × 15 + 50 decode scratch = 380 MB; 7 layers (350 MB) fit in 740
    p = uniform_plan(device_budget=740 * MB, ram_budget="1GB")
    assert len(p.on_device) == 7 and len(p.from_ram) == 21 and p.from_disk == ()
    assert p.device_bytes == 380 * MB + 7 * 50 * MB <= 740 * MB
    assert sorted(p.on_device + p.from_ram) == list(range(28))
    gaps = {b - a for a, b in zip(p.on_device, p.on_device[1:], strict=False)}
    assert gaps == {4}  # spread evenly: every 4th layer
    assert p.describe() == "28 layers: 7 on GPU, 21 streamed from RAM, 0 from disk; 315 MB moved per pass"


def test_layers_kept_encoded_fit_more_on_the_device():
    # the same 740 MB: floor 380 MB, room 360 MB holds 7 layers decoded (50 MB) or 24 encoded (15 MB)
    decoded = uniform_plan(device_budget=740 * MB, ram_budget="1GB")
    p = uniform_plan(device_budget=740 * MB, ram_budget="1GB", keep_encoded=True)
    assert p.on_device == () and len(p.encoded_on_device) == 24 and len(p.from_ram) == 4
    assert p.device_bytes == 380 * MB + 24 * 15 * MB <= 740 * MB and p.bytes_per_pass == 4 * 15 * MB < decoded.bytes_per_pass
    assert sorted(p.encoded_on_device + p.streamed) == list(range(28))
    assert {b - a for a, b in zip(p.streamed, p.streamed[1:])} == {7}  # the streamed ones spread too
    assert p.describe() == "28 layers: 24 kept encoded on GPU, 4 streamed from RAM, 0 from disk; 60 MB moved per pass"
    everything = uniform_plan(device_budget=380 * MB + 28 * 15 * MB, ram_budget="1GB", keep_encoded=True)
    assert len(everything.encoded_on_device) == 28 and everything.streamed == () and everything.bytes_per_pass == 0


def test_keep_encoded_is_ignored_where_the_encoding_is_not_smaller():
    p = plan_placement([50 * MB] * 4, 300 * MB, device_budget=450 * MB, ram_budget="1GB", device="cpu", keep_encoded=True)
    assert p.encoded_on_device == () and len(p.on_device) == 1


def test_ram_overflow_goes_to_disk():
    # RAM: 2 staging buffers × 15 MB + 10 layers × 15 MB = 180 MB ≤ 185 MB; an 11th would not fit
    p = uniform_plan(device_budget=740 * MB, ram_budget=185 * MB)
    assert (len(p.on_device), len(p.from_ram), len(p.from_disk)) == (7, 10, 11)
    assert p.ram_bytes == 180 * MB and p.disk_bytes_per_pass == 11 * 15 * MB
    assert set(p.from_ram).isdisjoint(p.from_disk) and set(p.streamed) == set(p.from_ram) | set(p.from_disk)


def test_device_budget_below_minimum():
    with pytest.raises(OndeviceError, match=r"below the 380 MB") as err:
        uniform_plan(device_budget="379MB", ram_budget="1GB")
    assert "\n" not in str(err.value)


def test_ram_budget_below_staging():
    with pytest.raises(OndeviceError, match=r"below the 30 MB needed to stream"):
        uniform_plan(device_budget=740 * MB, ram_budget="20MB")


def test_raw_layers_need_no_scratch():
    # transfer == decoded: floor = 300 + 2 × 50 = 400 MB, so 450 MB holds one resident layer
    p = plan_placement([50 * MB] * 4, 300 * MB, device_budget=450 * MB, ram_budget="1GB", device="cpu")
    assert len(p.on_device) == 1 and p.describe().startswith("4 layers: 1 on CPU, 3 streamed from RAM")
