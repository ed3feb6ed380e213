"""The README is the front door (the two commands first, at most 250 lines) and every page it leads to exists: each
relative link of the README and of docs/ names a file of the repository."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.mechanics
ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_the_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    commands = [line for line in lines[:8] if line.startswith("python3 -m pip install tox")]
    assert [c.split("#")[0].strip() for c in commands] == [
        "python3 -m pip install tox && python3 -m tox -e bench",
        "python3 -m pip install tox && python3 -m tox -e test,test-transformers455"]


def test_every_relative_link_of_the_readme_and_the_docs_names_a_file():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
    assert LINK.findall("see [a](docs/nowhere.md)") == ["docs/nowhere.md"]  # the pattern finds links at all


def test_every_docs_page_is_reached_from_the_readme_and_the_index():
    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"(docs/{page.name})" in readme and f"({page.name})" in index, page.name
