"""The `hosts` node source: machines you already have (see source.py)."""
