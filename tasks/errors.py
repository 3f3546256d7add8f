"""Errors raised on bad input: they always name the file and the place inside it."""
from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """Bad input data. `location` is a record, line or byte position inside `path`."""

    def __init__(self, path: str | Path, location: str, message: str):
        self.path = str(path)
        self.location = location
        self.message = message
        super().__init__(f"{self.path}: {location}: {message}")
