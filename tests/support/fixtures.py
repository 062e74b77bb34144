"""Paths of the data the tests read, all inside the repository (a plain clone has nothing beside it)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Request bodies from the workspace service's public material; their source is in its README.md.
EXAMPLES = FIXTURES / "examples"
