"""``tu:NAME`` and ``ogbg:NAME``: a dataset's name reads ``<root>/tu/NAME`` /
``<root>/ogbg/ogbg_NAME``, downloaded from its public home when missing (the archive
served from memory here: tests never touch the network)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from ogbg_folder import ogbg_folder

from ngra.datasets import DatasetNotFoundError, load


class _Response(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
    return buf.getvalue()


def _serve(monkeypatch, body: bytes) -> list[str]:
    asked: list[str] = []

    def urlopen(url, timeout):
        asked.append(url)
        return _Response(body)

    monkeypatch.setattr("ngra.datasets.download.urllib.request.urlopen", urlopen)
    return asked


def _mutag_zip(data_dir: Path) -> bytes:
    src = data_dir / "tu" / "MUTAG"
    return _zip({f"MUTAG/{f.name}": f.read_bytes() for f in src.glob("MUTAG_*.txt")})


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_a_tu_name_reads_the_roots_copy(data_dir):
    ds = load("tu:MUTAG", root=data_dir)  # the shared folder: <root>/tu/MUTAG, no download
    assert len(ds) == 188 and ds.info["spec"] == f"tu:path={data_dir / 'tu' / 'MUTAG'}"


def test_a_tu_name_is_downloaded_and_unpacked(data_dir, tmp_path, monkeypatch):
    asked = _serve(monkeypatch, _mutag_zip(data_dir))
    ds = load("tu:MUTAG", root=tmp_path, progress=False)
    assert asked == ["https://www.chrsmrrs.de/graphkerneldatasets/MUTAG.zip"]
    assert len(ds) == 188 and (tmp_path / "tu" / "MUTAG" / "MUTAG_A.txt").is_file()
    assert not _leftovers(tmp_path / "tu")  # neither the archive nor a partial folder
    assert len(load("tu:MUTAG", root=tmp_path)) == 188 and len(asked) == 1  # kept


def test_an_ogbg_name_is_downloaded_into_its_ogb_folder(tmp_path, monkeypatch):
    made = ogbg_folder(tmp_path / "src", "hiv")
    files = {f"hiv/{p.relative_to(made)}": p.read_bytes() for p in made.rglob("*")
             if p.is_file()}
    asked = _serve(monkeypatch, _zip(files))
    ds = load("ogbg:ogbg-molhiv", root=tmp_path / "root", progress=False)
    assert asked == ["http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/hiv.zip"]
    assert len(ds) == 4 and (tmp_path / "root" / "ogbg" / "ogbg_molhiv" / "raw").is_dir()
    assert "add_inverse_edge=True" in ds.info["direction"]  # a molecule set, by its name


def test_failures_name_the_dataset_the_url_and_the_fix(data_dir, tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError, match=r"tu:PROTEINS: .*downloading https://www\."
                       r"chrsmrrs\.de/graphkerneldatasets/PROTEINS\.zip failed"):
        load("tu:PROTEINS", root=tmp_path)  # the test's network refuses
    with pytest.raises(DatasetNotFoundError, match="downloading is off"):
        load("tu:PROTEINS", root=tmp_path, download=False)
    with pytest.raises(DatasetNotFoundError, match="not one of the OGB datasets ngra downloads"):
        load("ogbg:ogbg-code2", root=tmp_path)
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load(f"tu:{tmp_path / 'nowhere'}", root=tmp_path)  # a path is never downloaded
    _serve(monkeypatch, b"<html>not found</html>")
    with pytest.raises(DatasetNotFoundError, match="not a zip archive"):
        load("tu:MUTAG", root=tmp_path)
    _serve(monkeypatch, _zip({"../evil.txt": b"x", "MUTAG/MUTAG_A.txt": b"1, 2\n"}))
    with pytest.raises(DatasetNotFoundError, match="leaves the archive"):
        load("tu:MUTAG", root=tmp_path)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "tu" / "MUTAG").exists()
    assert not _leftovers(tmp_path / "tu")
