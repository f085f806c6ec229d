"""Every Python example in the README runs as written.

A block whose first line is ``# path/to/file.py`` is a file the reader writes: it is saved
under that path in a scratch folder on ``sys.path`` (and ``PYTHONPATH``, for the processes
an example starts). The other blocks run in order, in one namespace, in that folder, as a
reader pasting them into one session would.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_examples():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4
    assert any(b.startswith("# mypkg/layers.py") for b in blocks)


@pytest.mark.distributed
def test_readme_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(python_blocks(README.read_text())):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# ([\w/]+\.py)", first)
        if m:
            path = tmp_path / m[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
            for folder in path.relative_to(tmp_path).parents:
                if str(folder) != ".":
                    (tmp_path / folder / "__init__.py").touch()
            continue
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"README python block {i + 1} fails:\n{block}") from exc
