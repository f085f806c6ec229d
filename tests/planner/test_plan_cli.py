"""``ngra plan``: the table, the JSON file, and its errors (a cached calibration: no ranks)."""

from __future__ import annotations

import json

import pytest

from ngra.cli import main
from ngra.distributed.link import calibration_path, save_link
from ngra.planner import load_plans

from planner_cases import make_link


@pytest.fixture
def calibrated():
    for k in (1, 2, 4):
        save_link(make_link(k), calibration_path("gloo", "cpu", k))


def test_plan_an_mlp(calibrated, tmp_path, capsys):
    out = tmp_path / "plans.json"
    assert main(["plan", "--model", "mlp:64,256,64", "--rows", "512", "--devices", "4",
                 "--memory", "1GB", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pp1 dp4 tp1 m1" in text and "plans written to" in text
    data = json.loads(out.read_text())
    times = [p["predicted_time_s"] for p in data["plans"]]
    assert times == sorted(times) and len(times) > 8
    assert data["devices"] == 4 and data["chain"]["rows"] == 512
    assert load_plans(data)[0].label == data["plans"][0]["label"]
    assert set(data["plans"][0]["breakdown"]) >= {"compute", "dp_all_reduce", "tp_all_reduce",
                                                  "pipeline_bubble", "graph_exchange"}


def test_plan_a_gnn(calibrated, tmp_path, capsys):
    out = tmp_path / "plans.json"
    assert main(["plan", "--model", "ggcn", "--dataset", "sbm:nodes=300", "--devices", "2",
                 "--data-root", str(tmp_path), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {p["pipeline"] for p in data["plans"]} == {1}
    assert any(p["breakdown"]["graph_exchange"] > 0 for p in data["plans"])
    assert [h[0] for h in data["chain"]["halo"]] == [2]


def test_plan_a_gnn_reads_the_partition_books(calibrated, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NGRA_CACHE", raising=False)
    spec, book = "sbm:nodes=300", tmp_path / "book"
    assert main(["partition", "--dataset", spec, "--parts", "2", "--method", "range",
                 "--out", str(book), "--data-root", str(tmp_path)]) == 0
    figures = json.loads((book / "book.json").read_text())["figures"]
    out = tmp_path / "plans.json"
    assert main(["plan", "--model", "gcn", "--dataset", spec, "--devices", "4", "--partition",
                 str(book), "--data-root", str(tmp_path), "--out", str(out)]) == 0
    halo = dict(map(tuple, json.loads(out.read_text())["chain"]["halo"]))
    assert halo[2] == max(figures["halo_rows"]) > 0  # the given book's busiest rank
    cached = list(tmp_path.rglob("*metis-k4*/book.json"))  # what train caches
    assert len(cached) == 1
    assert halo[4] == max(json.loads(cached[0].read_text())["figures"]["halo_rows"])
    assert "graph exchange: halo rows of the busiest rank" in capsys.readouterr().out
    assert main(["plan", "--model", "gcn", "--dataset", spec, "--devices", "3", "--partition",
                 str(book), "--data-root", str(tmp_path)]) == 2
    assert "has 2 parts; 3 devices split rows [3] ways" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--model", "mlp:64,256,64", "--devices", "0"], "--devices must be an int >= 1"),
    (["--model", "mlp:64", "--devices", "2"], "expected mlp:W0,W1"),
    (["--devices", "2"], "give one of --model"),
    (["--model", "mlp:4096,4096", "--rows", "8", "--devices", "2", "--memory", "10MB"],
     "smallest peak of any plan is"),
    (["--module", "planner_cases:lstm_net", "--devices", "2"], "layer '1' (LSTM)"),
])
def test_plan_errors(calibrated, capsys, argv, message):
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err
