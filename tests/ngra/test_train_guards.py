"""Nothing trains silently on bad data or damaged files: one regression test per class,
each through `ngra train` (exit code and message) where a user would meet it."""

from __future__ import annotations

import gzip
import pickle

import pytest
import torch

import ngra
from ngra.training.checkpoint import CHECKPOINT_NAME, PREVIOUS_NAME, load_checkpoint, save_checkpoint
from ngra.cli import EXIT_BAD_INPUT, EXIT_DIVERGED, main
from ngra.training import TrainConfig
from ngra.training.loop import check_finite
from ngra.training.run import train

SBM = "sbm:nodes=200,blocks=2,feat=8"


def run(capsys, *args: str) -> tuple[int, str]:
    """``ngra train ARGS --no-progress``: (exit code, stderr)."""
    rc = main(["train", *args, "--no-progress"])
    return rc, capsys.readouterr().err


# ------------------------------------------------------------ unusable datasets
def test_edge_list_without_edges_is_refused(tmp_path, capsys):
    # Found by issue 23: trained and reported test_acc=nan with exit code 0.
    path = tmp_path / "g.txt"
    path.write_text("# no edges here\n")
    rc, err = run(capsys, "--dataset", f"edgelist:{path}", "--epochs", "2")
    assert rc == EXIT_BAD_INPUT
    assert f"edgelist:{path} has 0 vertices" in err


def test_three_vertex_edge_list_has_an_empty_train_split(tmp_path, capsys):
    # Found by issue 23: three vertices -> train=0.1 rounds to 0; it reported nan, exit 0.
    path = tmp_path / "g.txt"
    path.write_text("0 1\n1 2\n")
    rc, err = run(capsys, "--dataset", f"edgelist:{path}", "--epochs", "2")
    assert rc == EXIT_BAD_INPUT
    assert f"train split of edgelist:{path} has 0 vertices" in err


@pytest.mark.parametrize("spec, message", [
    ("sbm:nodes=50,blocks=1", "has 1 class among its 50 labelled vertices"),
    ("sbm:nodes=40,blocks=2,val=0", "validation split of sbm:nodes=40,blocks=2,val=0 has 0"),
    ("sbm:nodes=40,blocks=2,train=0.9,val=0.1", "test split of"),
])
def test_unusable_generated_datasets(capsys, spec, message):
    rc, err = run(capsys, "--dataset", spec, "--epochs", "2")
    assert rc == EXIT_BAD_INPUT and message in err


def test_non_finite_features_are_refused(tmp_path, capsys):
    folder = tmp_path / "ogbn_nan"
    files = {"raw/edge.csv": "0,1\n1,2\n2,3\n3,0\n",
             "raw/node-feat.csv": "0.1,0.2\nnan,0.3\n0.5,0.1\n0.2,0.2\n",
             "raw/node-label.csv": "0\n1\n0\n1\n",
             "split/s/train.csv": "0\n1\n", "split/s/valid.csv": "2\n", "split/s/test.csv": "3\n"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    rc, err = run(capsys, "--dataset", f"ogb:{folder}", "--epochs", "2")
    assert rc == EXIT_BAD_INPUT
    assert "1 features (x) of ogb:" in err and "not finite" in err and "vertex 1, column 0" in err


def test_a_graph_without_edges_trains_where_the_model_can(capsys, caplog):
    spec = "sbm:nodes=60,blocks=2,p_in=0,p_out=0,feat=8"
    rc, _ = run(capsys, "--model", "sage", "--dataset", spec, "--epochs", "2")
    assert rc == 0 and "has no edges" in caplog.text
    rc, err = run(capsys, "--model", "ggcn", "--dataset", spec, "--epochs", "2")
    assert rc == EXIT_BAD_INPUT
    assert "ggcn reads a vertex only through its in-edges" in err


# ------------------------------------------------------------ damaged files
def test_truncated_checkpoint_names_the_file_and_the_fix(tmp_path, capsys):
    # Found by issue 23: --resume ended in a torch traceback (PytorchStreamReader ...).
    ck = tmp_path / "ck"
    assert run(capsys, "--dataset", SBM, "--epochs", "2", "--checkpoint", str(ck))[0] == 0
    path = ck / CHECKPOINT_NAME
    path.write_bytes(path.read_bytes()[:3000])
    rc, err = run(capsys, "--dataset", SBM, "--epochs", "4", "--checkpoint", str(ck), "--resume")
    assert rc == EXIT_BAD_INPUT
    assert f"checkpoint {path} is damaged" in err and "without --resume" in err


def _inside_largest_member(path):
    """A byte offset in the middle of the data of the archive's largest member (a weight),
    not in padding between members that no checksum covers."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len + info.compress_size // 2


def test_resume_falls_back_to_the_previous_checkpoint(tmp_path, caplog):
    common = dict(model="gcn", dataset=SBM, seed=2, progress=False)
    full = train(TrainConfig(epochs=6, **common))
    ck = tmp_path / "ck"
    train(TrainConfig(epochs=4, checkpoint=str(ck), checkpoint_every=2, **common))
    assert load_checkpoint(ck / PREVIOUS_NAME)["epoch"] == 2  # kept beside the newest (4)
    newest = ck / CHECKPOINT_NAME
    data = bytearray(newest.read_bytes())
    data[_inside_largest_member(newest)] ^= 0x10  # one flipped bit: torch loads it silently
    newest.write_bytes(bytes(data))
    resumed = train(TrainConfig(epochs=6, checkpoint=str(ck), checkpoint_every=2, resume=True,
                                **common))
    assert "is damaged" in caplog.text and f"resuming from {ck / PREVIOUS_NAME}" in caplog.text
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in full["history"]]
    assert (ck / (CHECKPOINT_NAME + ".damaged")).is_file()
    assert load_checkpoint(ck / PREVIOUS_NAME)["epoch"] == 4  # the damaged file was not kept


def test_checkpoint_of_another_run_is_refused(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert run(capsys, "--dataset", SBM, "--epochs", "2", "--checkpoint", str(ck))[0] == 0
    rc, err = run(capsys, "--model", "sage", "--dataset", SBM, "--epochs", "4",
                  "--checkpoint", str(ck), "--resume")
    assert rc == EXIT_BAD_INPUT
    assert "written by another run (model='gcn' there, 'sage' here" in err


def test_save_keeps_the_previous_checkpoint(tmp_path):
    for epoch in (1, 2, 3):
        save_checkpoint({"epoch": epoch}, tmp_path)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["epoch"] == 3
    assert load_checkpoint(tmp_path / PREVIOUS_NAME)["epoch"] == 2
    assert {p.name for p in tmp_path.iterdir()} == {CHECKPOINT_NAME, PREVIOUS_NAME}


def test_gzip_cut_short_names_the_file(tmp_path, capsys):
    path = tmp_path / "g.txt.gz"
    path.write_bytes(gzip.compress(b"".join(b"%d %d\n" % (i, i + 1) for i in range(500)))[:-30])
    rc, err = run(capsys, "--dataset", f"edgelist:{path}", "--epochs", "2")
    assert rc == EXIT_BAD_INPUT
    assert f"{path} is a damaged gzip file" in err and "cut short" in err


# ------------------------------------------------------------ divergence
def test_non_finite_loss_stops_the_run(tmp_path, capsys):
    # Found by issue 23: a run whose loss became nan went on to the end.
    ck, out = tmp_path / "ck", tmp_path / "r.json"
    rc, err = run(capsys, "--dataset", SBM, "--epochs", "30", "--lr", "1e30",
                  "--checkpoint", str(ck), "--checkpoint-every", "1", "--out", str(out))
    assert rc == EXIT_DIVERGED
    assert "training diverged at epoch 2: the loss is nan" in err
    assert "--lr 1e+30" in err and "--weight-decay" in err
    assert f"The last checkpoint, {ck / CHECKPOINT_NAME} (epoch 1" in err
    kept = load_checkpoint(ck / CHECKPOINT_NAME)
    assert kept["epoch"] == 1 and all(bool(torch.isfinite(v).all())
                                      for v in kept["model"].values())
    assert not out.exists()  # no summary of a failed run


def test_non_finite_gradient_and_weight_are_divergence():
    model = torch.nn.Linear(2, 2)
    resolved = TrainConfig().resolved()
    model.weight.grad = torch.tensor([[0.0, float("inf")], [0.0, 0.0]])
    with pytest.raises(ngra.TrainingDivergedError, match="epoch 7: the gradient of weight"):
        check_finite(7, resolved, model, torch.tensor(1.0))
    model.weight.grad = None
    with torch.no_grad():
        model.bias[0] = float("nan")
    with pytest.raises(ngra.TrainingDivergedError, match="weight bias is not finite") as err:
        check_finite(3, resolved, model)
    assert err.value.epoch == 3


# ------------------------------------------------------------ arguments
@pytest.mark.parametrize("args, message", [
    (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
    (["--resume"], "--resume needs --checkpoint DIR"),
    (["--out", "."], "is a folder; it must name the JSON file"),
])
def test_settings_that_cannot_work_fail_before_training(capsys, args, message):
    rc, err = run(capsys, "--dataset", SBM, "--epochs", "1", *args)
    assert rc == EXIT_BAD_INPUT and message in err


def test_errors_are_exported_and_picklable():
    import ngra.datasets

    assert ngra.DatasetError is ngra.datasets.DatasetError
    assert issubclass(ngra.DamagedFileError, ngra.DatasetError)
    for err in (ngra.DamagedFileError("f.txt", "m"), ngra.CheckpointError("c.pt", "m"),
                ngra.TrainingDivergedError(4, "m")):
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == "m"
