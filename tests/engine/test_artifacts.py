"""W&B records a run's checkpoints and its test's mistakes, offline too (uploaded later by `wandb sync`): read back
from the offline run file, W&B's own format."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fake_wandb
import pytest
from helpers import LIMIT

from kiln.commands.boundary import main
from kiln.wandb import offline as wandb_offline


@pytest.mark.slow  # a W&B offline run with model artifacts: 3.8 s
def test_checkpoints_are_model_artifact_versions_once_each_and_mistakes_a_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *LIMIT, "--trainer.logger.init_args.log_model", "true"])
    (run_dir,) = Path("runs/digits").iterdir()
    logged = wandb_offline.artifacts(wandb_offline.run_file(run_dir))  # type: ignore[arg-type]
    models = [a for a in logged if a["type"] == "model"]
    assert [a["metadata"]["file"] for a in models] == [  # the best, then the newest state; the test after fit
        next(run_dir.glob("checkpoints/best-*.ckpt")).name,
        "last.ckpt",
    ]  # finalizes again and adds none
    best, latest = models
    assert "best" in best["aliases"] and latest["aliases"] == ["latest"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert best["metadata"]["monitor"] == "val/loss"
    assert best["metadata"]["score"] == pytest.approx(metrics["val"]["best"]["val/loss"])
    assert latest["metadata"]["global_step"] == metrics["global_step"] == 10
    config_hash = hashlib.sha256((run_dir / "config.yaml").read_bytes()).hexdigest()
    assert {a["metadata"]["config_sha256"] for a in models} == {config_hash}
    assert all(a["files"] == ["model.ckpt"] for a in models)

    (table,) = [a for a in logged if a["type"] == "run_table" and "confident_mistakes" in a["name"]]
    assert sum(f.endswith(".png") for f in table["files"]) == 16  # each mistake's input, as a picture
    (rows,) = run_dir.glob("wandb/offline-run-*/files/media/table/test/confident_mistakes_*.table.json")
    written = json.loads(rows.read_text())
    assert written["columns"] == ["input", "label", "prediction", "confidence", "probabilities"]
    confidences = [row[3] for row in written["data"]]
    assert len(confidences) == 16 and confidences == sorted(confidences, reverse=True)
    assert all(row[1] != row[2] for row in written["data"])  # mistakes only


@pytest.mark.slow
def test_a_wandb_version_resolves_offline_for_fit_test_predict_and_export_and_a_changed_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_ARTIFACT_DIR", str(tmp_path / "downloads"))
    main(["fit", *LIMIT, "--trainer.logger.init_args.log_model", "true"])
    (run_dir,) = Path("runs/digits").iterdir()
    run_id = wandb_offline.run_file(run_dir).parent.name.rsplit("-", 1)[1]  # type: ignore[union-attr]
    best = next(run_dir.glob("checkpoints/best-*.ckpt")).resolve()
    capsys.readouterr()

    main(["test", "--ckpt_path", f"wandb:someone/kiln/model-{run_id}:best", "--trainer.logger", "false"])
    assert f"--ckpt_path wandb:someone/kiln/model-{run_id}:best: {best} (logged offline by" in capsys.readouterr().err
    main(["predict", "--ckpt_path", f"wandb:kiln/model-{run_id}:best", "--trainer.logger", "false"])
    assert f": {best} (logged offline" in capsys.readouterr().err

    # the newest state trains on: the version logged is no longer that file, and nothing may read it as such
    logged = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    main(["fit", *LIMIT, "--ckpt_path", "last", "--trainer.max_epochs", "3", "--trainer.logger", "false"])
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() != logged
    with pytest.raises(SystemExit) as stop:
        main(["test", "--ckpt_path", f"wandb:kiln/model-{run_id}:latest"])
    assert stop.value.code == 2
    assert "has changed since, and W&B's artifact cache" in capsys.readouterr().err

    # W&B's artifact cache holds the version (as `wandb sync` or a download leaves it): read from there
    fake_wandb.put_in_cache(tmp_path / "wandb-cache", logged)
    digest = hashlib.md5(logged).hexdigest()
    main(["fit", *LIMIT, "--ckpt_path", f"wandb:kiln/model-{run_id}:latest", "--trainer.max_epochs", "3",
          "--trainer.logger", "false"])  # fmt: skip
    newest = max(d for d in Path("runs/digits").iterdir() if d.name[0].isdigit())  # a fit's, not a test's
    resumed = json.loads((newest / "metrics.json").read_text())
    assert resumed["global_step"] == 15  # on from step 10 of the logged state, not from 0 nor the state trained on
    downloaded = tmp_path / "downloads" / f"model-{run_id}-{digest[:12]}" / "model.ckpt"
    assert downloaded.read_bytes() == logged
    main(["export", "--ckpt_path", f"wandb:kiln/model-{run_id}:latest", "--format", "onnx", "--samples", "16"])
    parity = json.loads((downloaded.parent / "export" / "parity.json").read_text())
    assert parity["checkpoint_version"] == f"wandb:kiln/model-{run_id}:latest"
    assert parity["checkpoint"] == str(downloaded)
