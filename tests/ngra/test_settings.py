"""ngra.settings: every NGRA_* variable declared once, read at use (never at import), a bad
value named where it is used; ``ngra info`` lists them and the scoped settings."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ngra import settings
from ngra.settings import SCOPED, SETTINGS, get, resolved

ROOT = Path(__file__).resolve().parents[2]
#: The package folders (pyproject's package-dir) whose source must declare what it reads.
SOURCES = ("ngra", "kernels", "partition", "datasets")
#: Context managers that are not settings, and why.
NOT_SETTINGS = {
    "thread_setting": "the helper the thread-local settings are built on",
    "_quiet_elastic": "silences torch's launcher loggers around a launch",
    "placed": "a training step's placement: enters memory_budget / device_streaming",
    "judged_on": "a plan's hook that enters partials_judged_on for its kernels",
    "interruptible": "a run's signal handlers (SIGINT/SIGTERM raise Interrupted)",
    "_signals_deferred": "holds SIGINT/SIGTERM while a checkpoint is written",
    "atomic_output": "a file being written under a temporary name, renamed when complete",
    "named_failure": "a torchrun rank's training: an error names the rank and ends it",
    "link_files": "the link ranks' shards and pair files, the pairs removed on exit",
}
#: A value each setting refuses (path settings accept any string).
BAD = {"NGRA_KERNEL_BACKEND": "bogus", "NGRA_DST_PARTIALS": "bogus", "NGRA_AVX512": "maybe",
       "NGRA_TEST_SEED": "seven", "NGRA_HYPOTHESIS_PROFILE": "bogus"}


def _source_files() -> list[Path]:
    return [p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))]


def test_every_ngra_variable_in_the_source_is_declared():
    pattern = re.compile(r"(?<![A-Za-z0-9_])NGRA_[A-Z0-9_]+")
    files = _source_files() + sorted(ROOT.glob("tests/**/conftest.py")) + [ROOT / "Makefile"]
    used: dict[str, str] = {}
    for path in files:
        if not path.exists():
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for name in pattern.findall(line):
                used.setdefault(name, f"{path.relative_to(ROOT)}:{lineno}")
    missing = {n: where for n, where in used.items() if n not in SETTINGS}
    assert not missing, f"NGRA_* names used but not declared in ngra.settings.SETTINGS: {missing}"
    assert {"NGRA_KERNEL_BACKEND", "NGRA_DST_PARTIALS", "NGRA_AVX512", "NGRA_CACHE",
            "NGRA_DATA", "NGRA_CALIBRATION"} <= set(used)


def test_only_the_settings_module_reads_ngra_variables():
    reads = re.compile(r"(os\.environ|getenv)\b[^\n]*NGRA_")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in _source_files() if p.name != "settings.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert not found, f"read NGRA_* through ngra.settings.get: {found}"


def test_each_setting_is_documented():
    for s in SETTINGS.values():
        assert s.name.startswith("NGRA_") and s.doc and s.expected and s.read_by, s.name


def test_get_reads_the_environment_at_call_time(monkeypatch):
    monkeypatch.delenv("NGRA_KERNEL_BACKEND", raising=False)
    assert get("NGRA_KERNEL_BACKEND") == "auto"
    for backend in ("ref", "cpu", "gpu", "auto"):
        monkeypatch.setenv("NGRA_KERNEL_BACKEND", backend)
        assert get("NGRA_KERNEL_BACKEND") == backend
    monkeypatch.setenv("NGRA_KERNEL_BACKEND", "")  # empty counts as unset
    assert get("NGRA_KERNEL_BACKEND") == "auto"
    monkeypatch.setenv("NGRA_AVX512", "0")
    assert get("NGRA_AVX512") is False
    monkeypatch.setenv("NGRA_DATA", "/somewhere/data")
    assert get("NGRA_DATA") == Path("/somewhere/data")
    monkeypatch.setenv("NGRA_TEST_SEED", "12")
    assert get("NGRA_TEST_SEED") == 12


def test_readers_follow_the_environment(monkeypatch, tmp_path):
    from ngra.calibration import calibration_file
    from ngra.datasets import data_root
    from ngra.datasets.cache import cache_root
    from ngra.kernels import fused_edge, registry

    monkeypatch.setenv("NGRA_DATA", str(tmp_path / "d"))
    assert data_root() == (tmp_path / "d").resolve()
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "c"))
    assert cache_root(tmp_path) == (tmp_path / "c").resolve()
    monkeypatch.setenv("NGRA_CALIBRATION", str(tmp_path / "k"))
    assert calibration_file("link").parent == tmp_path / "k"
    monkeypatch.setenv("NGRA_KERNEL_BACKEND", "ref")
    assert registry.current_backend() == "ref"
    assert registry.backend_for("gspmm") == "ref"
    monkeypatch.setattr(fused_edge, "DST_PARTIALS", None)
    monkeypatch.setenv("NGRA_DST_PARTIALS", "never")
    assert fused_edge.dst_partials() == "never"
    monkeypatch.setattr(fused_edge, "DST_PARTIALS", "always")  # tests' override wins
    assert fused_edge.dst_partials() == "always"


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_fails_at_use_naming_the_variable(monkeypatch, name):
    monkeypatch.setenv(name, BAD[name])
    with pytest.raises(ValueError, match=rf"^{name} must be .*; got '{BAD[name]}'\."):
        get(name)
    row = next(r for r in resolved() if r.name == name)  # reported, not raised
    assert row.value == BAD[name] and row.source.startswith("env (invalid")


def test_kernels_name_a_bad_backend_at_the_call(monkeypatch):
    import torch

    from ngra.kernels import fused_edge, gspmm

    monkeypatch.setenv("NGRA_KERNEL_BACKEND", "bogus")
    indptr, indices = torch.tensor([0, 1]), torch.tensor([0])
    with pytest.raises(ValueError, match="NGRA_KERNEL_BACKEND must be one of auto, ref, cpu, gpu"):
        gspmm(indptr, indices, torch.ones(1, 2), reduce="sum")
    monkeypatch.setattr(fused_edge, "DST_PARTIALS", None)
    monkeypatch.setenv("NGRA_DST_PARTIALS", "sometimes")
    with pytest.raises(ValueError, match="NGRA_DST_PARTIALS must be one of auto, always, never"):
        fused_edge.dst_partials()


def test_import_succeeds_whatever_the_environment_holds():
    script = ("import ngra, ngra.kernels, ngra.kernels.fused_edge, ngra.datasets, ngra.cli\n"
              "print('imported', flush=True)\n"
              "ngra.kernels.fused_edge.dst_partials()\n")
    env = {**os.environ, **BAD}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert r.stdout.startswith("imported"), r.stderr
    assert r.returncode != 0 and "NGRA_DST_PARTIALS must be one of" in r.stderr, r.stderr


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="not an ngra setting"):
        get("NGRA_NO_SUCH_THING")


def test_resolved_says_where_each_value_came_from(monkeypatch):
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NGRA_DST_PARTIALS", "never")
    rows = {r.name: r for r in resolved()}
    assert list(rows) == list(SETTINGS)
    assert rows["NGRA_DST_PARTIALS"][1:3] == ("never", "env")
    assert rows["NGRA_KERNEL_BACKEND"][1:3] == ("auto", "default")
    assert all(r.source == "default" for n, r in rows.items() if n != "NGRA_DST_PARTIALS")


def test_scoped_settings_exist_where_they_are_said_to_be():
    for name, line in SCOPED.items():
        path, sep, meaning = line.partition(": ")
        assert sep and meaning, f"{name}: expected 'module.function: meaning'; got {line!r}"
        module, _, attr = path.rpartition(".")
        assert attr == name, line
        assert callable(getattr(importlib.import_module(module), attr)), line


def test_every_context_manager_is_a_listed_setting_or_said_not_to_be():
    found = {}
    for path in _source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and any(
                    "contextmanager" in ast.unparse(d) for d in node.decorator_list):
                found[node.name] = f"{path.relative_to(ROOT)}:{node.lineno}"
    unlisted = {n: where for n, where in found.items() if n not in SCOPED and n not in NOT_SETTINGS}
    assert not unlisted, f"scoped settings missing from ngra.settings.SCOPED: {unlisted}"


def test_ngra_info_lists_every_setting_and_the_scoped_ones(monkeypatch, capsys):
    from ngra.cli import main

    monkeypatch.setenv("NGRA_DST_PARTIALS", "never")
    monkeypatch.delenv("NGRA_KERNEL_BACKEND", raising=False)
    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in info["settings"]}
    assert list(rows) == list(SETTINGS)
    assert (rows["NGRA_DST_PARTIALS"]["value"], rows["NGRA_DST_PARTIALS"]["source"]) == ("never",
                                                                                          "env")
    assert rows["NGRA_KERNEL_BACKEND"]["source"] == "default"
    assert all(r["doc"] for r in rows.values())
    assert info["scoped"] == SCOPED


def test_the_module_imports_only_the_standard_library():
    tree = ast.parse(Path(settings.__file__).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots
