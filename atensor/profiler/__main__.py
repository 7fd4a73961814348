# Entry point of `python -m atensor.profiler trace.json` (the CLI itself is cli.py).
from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
