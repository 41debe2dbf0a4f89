"""Where things are: the repository root, and the folders of the tests' importable helpers."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: On ``sys.path`` in every test process (``pythonpath`` in pyproject.toml); a child process gets them
#: through ``PYTHONPATH`` (:data:`HELPER_PATHS`).
HELPER_DIRS = (ROOT / "tests" / "helpers", ROOT / "tests" / "doubles")
HELPER_PATHS = [str(d) for d in HELPER_DIRS]
