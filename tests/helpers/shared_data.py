"""The corpora beside the repository (emodb, speech_commands), and skipping tests without them."""

from pathlib import Path

import pytest

# the corpora beside the repository: CI clones it next to a copy of shared/
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}")
