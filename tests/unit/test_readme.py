"""The README stays a short teaching document; its examples are run by tests/integration/test_readme_examples.py."""

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_is_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move design and figures to docs/"


def test_the_readme_points_to_docs_that_exist():
    text = README.read_text()
    for doc in ("docs/design.md", "docs/reliability.md", "docs/benchmarks.md", "docs/multinode.md"):
        assert doc in text and (README.parent / doc).is_file(), doc
