"""ondevice: exact speculative decoding on the hardware you own.

    import ondevice
    with ondevice.load() as pipe:  # the default pair, downloaded on first use
        for record in pipe.stream([{"role": "user", "content": "Hello"}], max_tokens=64):
            print(record.text, end="")
"""

__version__ = "0.1.0"


def load(model: str | None = None, **options):
    """Load a model pair into a `Pipeline` (see `ondevice.loading.options.LoadOptions` for the options;
    `answers=ondevice.loading.options.Answers(prompts, max_tokens)`: what it will answer, when known).
    Imported lazily: `import ondevice` stays cheap (no torch, no llama.cpp)."""
    from ondevice.pipeline import load as load_pipeline  # lazy: `import ondevice` stays cheap (no torch, no llama.cpp)

    return load_pipeline(model, **options)
