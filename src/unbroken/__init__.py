"""Unbroken: keeps distributed PyTorch training running through faults."""

__version__ = "0.1.0"
