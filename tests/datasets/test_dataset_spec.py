"""Spec strings: parsing, defaults, canonical form, errors; data-root resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from ngra.datasets import SpecError, available, data_root, describe, load, parse_spec


def test_defaults_and_canonical_form() -> None:
    s = parse_spec("rmat:scale=18,edge_factor=16,feat=64,classes=8,seed=0")
    assert s.name == "rmat" and s.params["scale"] == 18 and s.params["a"] == 0.57
    assert s.params["symmetric"] is False and s.params["simple"] is True
    assert str(s).startswith(
        "rmat:scale=18,edge_factor=16,a=0.57,b=0.19,c=0.19,feat=64,classes=8,seed=0"
    )
    assert parse_spec("sbm").canonical() == parse_spec("SBM:nodes=2000,seed=0").canonical()
    assert parse_spec("rmat:a=0.45,b=0.15,c=0.15").params["c"] == 0.15


def test_value_types() -> None:
    s = parse_spec("sbm:nodes=1e3,p_in=0.1,train=0.5")
    assert s.params["nodes"] == 1000 and isinstance(s.params["nodes"], int)
    assert parse_spec("rmat:symmetric=yes,simple=0").params["symmetric"] is True
    assert parse_spec("rmat:symmetric=yes,simple=0").params["simple"] is False
    assert parse_spec("twitter:symmetric=auto").params["symmetric"] is None
    assert parse_spec("pubmed:structure").params["structure"] is True
    assert parse_spec("PubMed:structure=false").params["structure"] is False
    assert parse_spec("edgelist:/a/b.txt.gz,feat=8").params == {
        **parse_spec("edgelist:/a/b.txt.gz").params,
        "feat": 8,
    }
    assert parse_spec("edgelist:path=/a/b.txt").params["path"] == "/a/b.txt"
    assert parse_spec("ego-twitter").name == "twitter"


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("corra")
    msg = str(err.value)
    assert "'corra'" in msg
    for name in ("cora", "citeseer", "pubmed", "rmat", "sbm", "edgelist", "ogb", "twitter"):
        assert name in msg
    assert set(available()) >= {
        "cora",
        "citeseer",
        "pubmed",
        "rmat",
        "sbm",
        "edgelist",
        "ogb",
        "twitter",
    }
    assert "scale=16" in describe()


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("rmat:scael=3", r"unknown key 'scael'.*Valid keys: scale"),
        ("rmat:scale=big", r"scale must be an integer; got 'big'"),
        ("rmat:scale=2.5", r"scale must be an integer"),
        ("sbm:p_in=high", r"p_in must be a number"),
        ("rmat:symmetric=maybe", r"symmetric must be true/false"),
        ("sbm:nodes=10,nodes=20", r"given twice"),
        ("cora:fast", r"cannot read 'fast'.*Valid keys: structure"),
        ("edgelist", r"edgelist needs a path"),
        ("ogb:", r"ogb needs a path"),
        ("", r"non-empty"),
        ("rmat:labels=", r"labels must not be empty"),
    ],
)
def test_spec_errors(spec: str, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        parse_spec(spec)


def test_spec_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        load("nope")


def test_data_root_resolution(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NGRA_DATA", str(tmp_path / "env"))
    assert data_root() == (tmp_path / "env").resolve()
    assert data_root(tmp_path / "explicit") == (tmp_path / "explicit").resolve()
    monkeypatch.delenv("NGRA_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == (tmp_path / "home" / ".ngra" / "data").resolve()


def test_env_root_used_by_load(data_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("NGRA_DATA", str(data_dir))
    assert load("cora").num_nodes == 2708
