"""The toolkit's version on every page of the site: read from ``toolkit/version.py``, the one
place it is written (``toolkit --version`` and the package's metadata read it there too)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def version() -> str:
    """The ``__version__`` of toolkit/version.py, read as text: the site builds without
    importing the toolkit's dependencies for this."""
    text = (ROOT / "toolkit" / "version.py").read_text(encoding="utf-8")
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


def on_config(config):
    config["site_name"] = f"toolkit {version()}"
    config["copyright"] = f"toolkit {version()}, BSD-2-Clause licence"
    return config
