"""Where things are, for the tests, helpers and workers (the suite is in rooms under tests/)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DATA = TESTS / "data"
WORKERS = TESTS / "workers"
EXAMPLES = REPO / "examples"
TRAIN = REPO / "tools" / "train.py"
