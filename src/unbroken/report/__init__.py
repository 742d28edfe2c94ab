"""A run seen by a person: an HTML report with inline SVG charts, from the run's ledger."""

from unbroken.report.page import render

__all__ = ["render"]
