# Every ```python block of docs/python.md and README.md runs (the docs never show code that does not
# work), each in a fresh namespace with a temporary working directory.
import re

import pytest

from conftest import SOURCE_DIR

DOCS = [SOURCE_DIR / "docs" / "python.md", SOURCE_DIR / "README.md"]
BLOCKS = [(doc, i, code) for doc in DOCS
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S))]


def test_the_pages_have_examples():
    assert sum(doc.name == "python.md" for doc, _, _ in BLOCKS) >= 4
    assert any(doc.name == "README.md" for doc, _, _ in BLOCKS)


@pytest.mark.parametrize("doc,i,block", BLOCKS, ids=[f"{d.name}-{i + 1}" for d, i, _ in BLOCKS])
def test_example(doc, i, block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{doc}: python block {i + 1}", "exec"), {"__name__": f"docs_example_{i + 1}"})
    out = capsys.readouterr().out
    # The printed lines a page shows as comments (`print(...)   # text`) are what the code prints.
    for shown in re.findall(r"print\(.*\)[ \t]+# (.+)", block):
        assert shown.strip() in out, f"{doc.name} block {i + 1} shows '{shown}', printed:\n{out}"
