"""W&B records a run's checkpoints and its test's mistakes, offline too (uploaded later by `wandb sync`): read back
from the offline run file, W&B's own format."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers import LIMIT

from kiln import wandb_offline
from kiln.boundary import main


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
