"""hpcdl's version, read by pyproject.toml and `hpcdl info`."""
__version__ = "0.1.0"
