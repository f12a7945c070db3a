"""ondevice: exact speculative decoding on the hardware you own."""

__version__ = "0.1.0"
