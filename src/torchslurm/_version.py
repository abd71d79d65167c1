"""The version alone: a leaf, so that anything may import it without pulling in the package."""

__version__ = "0.1.0"
