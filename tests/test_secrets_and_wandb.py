"""Secrets stay out of every file a run writes; W&B without a reachable server never blocks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import LIMIT

from kiln.cli import build_cli, main
from kiln.loggers import Wandb
from kiln.secrets import REDACTED, redact


def test_redact_replaces_values_under_secret_names_only() -> None:
    config = {"model": {"api_key": "x", "token_file": "", "lr": 0.1, "nested": [{"password": "p", "name": "n"}]}}
    config["model"] |= {"api_keys": {"hf": "h"}, "db_password": 123456, "auth": {"bearer": "b"}, "tokenizer": "t"}
    assert redact(config) == {
        "model": {
            "api_key": REDACTED, "token_file": "", "lr": 0.1, "nested": [{"password": REDACTED, "name": "n"}],
            "api_keys": REDACTED, "db_password": REDACTED, "auth": REDACTED, "tokenizer": "t",
        }
    }  # fmt: skip
    assert redact({"settings": {"bearer": "b", "max_tokens": 5}}) == {"settings": {"bearer": REDACTED, "max_tokens": 5}}


def test_planted_secrets_appear_in_no_file_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "env-s3cr3t-0123456789abcdef0123456789abcdef01234567")
    planted = ["--model.class_path", "faulty.WithApiKey", "--model.init_args.api_key", "cli-s3cr3t-value",
               "--model.init_args.api_keys", '{"hf": "dict-s3cr3t-value"}', "--model.init_args.password", "987654321",
               "--model.init_args.auth", '{"bearer": "bearer-s3cr3t-value"}']  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["kiln", "fit", *LIMIT, *planted])  # W&B records the command line
    main()
    (run_dir,) = Path("runs/digits").iterdir()
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10 and any(p.suffix == ".wandb" for p in files)
    for path in files:
        content = path.read_bytes()
        for secret in (b"cli-s3cr3t", b"env-s3cr3t", b"dict-s3cr3t", b"987654321", b"bearer-s3cr3t"):
            assert secret not in content, (path, secret)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["api_key"] == REDACTED
    assert REDACTED in (run_dir / "config.yaml").read_text()


@pytest.mark.slow
def test_key_without_reachable_server_logs_offline_quickly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    started = time.monotonic()
    main(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false"])
    elapsed = time.monotonic() - started
    (notice,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("W&B: server unreachable")]
    assert "127.0.0.1:9" in notice
    (run_dir,) = Path("runs/digits").iterdir()
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    assert elapsed < 60  # a blocked W&B start-up alone takes ~100 s; this whole run takes seconds


def test_wandb_logger_arguments_reach_the_run_without_deprecation_warnings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["--trainer.logger.init_args.tags", "[a, b]", "--trainer.logger.init_args.group", "g1"]
    cli = build_cli(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false", *args])
    run = cli.trainer.logger.experiment  # type: ignore[union-attr]
    assert isinstance(cli.trainer.logger, Wandb)
    assert tuple(run.tags) == ("a", "b") and run.group == "g1" and run.project == "kiln"
    assert run.name == f"digits/{cli.run_dir.name}"  # type: ignore[union-attr]
    assert "anonymous" not in capsys.readouterr().err  # Lightning's class passes it and W&B warns every run
