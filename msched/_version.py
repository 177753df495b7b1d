"""msched's version, in one place: ``pyproject.toml`` reads it from here (setuptools'
``dynamic`` version, read without importing msched and torch) and `msched` exports it."""

__version__ = "0.1.0"
