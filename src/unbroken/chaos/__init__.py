"""Fault injection: a timed schedule of real faults against a running job (``--chaos``)."""

from unbroken.chaos.schedule import ChaosError, ChaosFault, InjectKind, load_chaos, parse_chaos

__all__ = ["ChaosError", "ChaosFault", "InjectKind", "load_chaos", "parse_chaos"]
