"""Import one of scripts/<folder>/*.py as a module, for the tests that drive a script's functions directly."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """scripts/<folder>/<name>.py as the module `scripts.<folder>.<name>` (`name` is "folder.name", e.g.
    "peers.parity"); the checkout's root goes on sys.path, as when a script runs, so its sibling modules import."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    return importlib.import_module(f"scripts.{name}")
