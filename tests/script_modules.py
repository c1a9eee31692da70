"""Load one of scripts/*.py as a module, for the tests that drive a script's functions directly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py imported as module `name` (registered first: its dataclasses look their module up); the
    scripts folder goes on sys.path, as when the script runs, so its sibling modules import."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
