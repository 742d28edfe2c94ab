"""What a user watching ``unbroken run`` sees: one line per fact, progress every few steps."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Console:
    def __init__(self, quiet: bool = False, out: TextIO | None = None) -> None:
        self.quiet = quiet
        self.out = out or sys.stdout
        self.t0 = time.time()

    def line(self, text: str, at: float | None = None) -> None:
        if self.quiet:
            return
        t = (at or time.time()) - self.t0
        self.out.write(f"[{t:7.2f}s] {text}\n")
        self.out.flush()
