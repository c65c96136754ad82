"""Secrets stay out of every file a run writes; W&B without a reachable server never blocks."""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import fake_wandb
import forkserver
import pytest
import torch
import yaml
from helpers import LIMIT

from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.process.secrets import REDACTED, redact
from kiln.training.loggers import Wandb
from kiln.wandb.mode import ensure_wandb_mode


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
    assert sys.argv == ["kiln", "fit", *LIMIT, *planted]  # hidden from W&B alone, never rewritten for good
    (run_dir,) = Path("runs/digits").iterdir()
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10 and any(p.suffix == ".wandb" for p in files)
    for path in files:
        content = path.read_bytes()
        for secret in (b"cli-s3cr3t", b"env-s3cr3t", b"dict-s3cr3t", b"987654321", b"bearer-s3cr3t"):
            assert secret not in content, (path, secret)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["hyper_parameters"]["api_key"] == REDACTED
    assert REDACTED in (run_dir / "config.yaml").read_text()


class FakeServer(BaseHTTPRequestHandler):
    """Answers every POST with ``status`` (and W&B's viewer query with a viewer on 200); records the requests."""

    status = 200
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        request = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        status = self.status
        if status == 500 and b"viewer" in request and b"upsertBucket" not in request:  # a partial outage:
            status = 200  # the key checks out, creating the run fails
        body = json.dumps({"data": {"viewer": {"id": "u1"}}} if status == 200 else {"error": "no"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def local_server(kind: str) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A base URL on 127.0.0.1 (nothing listening, a port that accepts TCP but never answers, or one answering
    HTTP ``kind``) and the (path, Authorization) of each request it answered."""
    if kind == "refused":
        yield "http://127.0.0.1:9", []  # nothing listens on the discard port
        return
    if kind == "silent":  # the kernel completes the handshake for a listening socket that never reads
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}", []
        return
    seen: list[tuple[str, str]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (FakeServer,), {"status": int(kind), "seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()


KEY = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("refused", "Connection refused"),
        ("silent", "no answer in 10 s"),
        ("404", "HTTP 404"),
        ("401", "key was refused"),
    ],
)
def test_a_server_that_cannot_start_an_online_run_means_offline_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, kind: str, cause: str
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    with local_server(kind) as (url, _):
        monkeypatch.setenv("WANDB_BASE_URL", url)
        main(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false"])
    (notice,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("W&B: cannot start")]
    assert url in notice and cause in notice and "logging offline" in notice  # a silent server: 10 s, not W&B's 110
    (run_dir,) = Path("runs/digits").iterdir()
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    assert (
        torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 5
    )  # it trained


@pytest.mark.slow
def test_a_run_w_and_b_cannot_create_trains_offline_with_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "WANDB_MODE"}  # a W&B session of its own
    env |= {"WANDB_API_KEY": KEY, "WANDB_INIT_TIMEOUT": "5"}  # kiln's own default is 30 s (W&B's 90)
    with local_server("500") as (url, _):  # the key's probe passes, then HTTP 500 to everything else
        command = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.max_epochs", "1"]
        done = forkserver.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                              env={**env, "WANDB_BASE_URL": url})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]  # was: 90 s blocked, a traceback, exit 1, nothing trained
    (notice,) = [line for line in done.stderr.splitlines() if line.startswith("W&B: the run could not")]
    assert "logging offline" in notice
    (run_dir,) = (tmp_path / "runs" / "digits").iterdir()
    assert list(run_dir.glob("wandb/offline-run-*")) and "test" in json.loads((run_dir / "metrics.json").read_text())


def test_a_server_that_knows_the_key_keeps_the_run_online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    with local_server("200") as (url, requests):
        monkeypatch.setenv("WANDB_BASE_URL", url)
        assert ensure_wandb_mode() is None
    (seen,) = requests
    assert "WANDB_MODE" not in os.environ
    assert seen == ("/graphql", "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode())


def test_the_key_from_wandb_login_is_the_one_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_MODE")
    with local_server("401") as (url, requests):
        monkeypatch.setenv("WANDB_BASE_URL", url)
        (tmp_path / "no-netrc").write_text(f"machine 127.0.0.1\n  login user\n  password {KEY}\n")
        assert "the API key was refused" in (ensure_wandb_mode() or "")
    (seen,) = requests
    assert seen[1] == "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode()


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


def test_dict_typed_init_arguments_run_and_are_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # the README's route to any other wandb.init argument
    extra = ["--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
             "--trainer.logger.dict_kwargs.config", '{"team_note": 1}']  # fmt: skip
    main(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false", *extra])
    (run_dir,) = Path("runs/digits").iterdir()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["trainer"]["logger"]["init_args"]["config"] == {"team_note": 1}  # a dict, not a Namespace
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 5


@pytest.mark.slow
def test_a_given_secret_is_used_when_the_checkpoint_holds_it_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    model = ["--model.class_path", "faulty.WithApiKey", "--model.init_args.api_key", "real-s3cr3t"]
    fit = build_cli(["fit", *LIMIT, "--trainer.max_epochs", "1", "--trainer.logger", "false",
                     "--run.test_after_fit", "false", *model])  # fmt: skip
    ckpt = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True, map_location="cpu")["hyper_parameters"]["api_key"] == REDACTED
    for subcommand in ("test", "predict"):  # Lightning would apply the checkpoint's (redacted) value over the given one
        cli = build_cli([subcommand, *LIMIT, "--trainer.logger", "false", *model, "--ckpt_path", str(ckpt)])
        assert cli.model.api_key == "real-s3cr3t"


@pytest.mark.slow
def test_online_a_wandb_version_is_asked_of_the_server_and_one_it_lacks_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    with local_server("200") as (url, requests):  # knows the key, holds no artifact
        monkeypatch.setenv("WANDB_BASE_URL", url)
        with pytest.raises(SystemExit) as stop:
            main(["test", "--ckpt_path", "wandb:me/kiln/model-1a2b3c4d:best"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: --ckpt_path wandb:me/kiln/model-1a2b3c4d:best: W&B could not give this version (" in err
    assert "Traceback" not in err and len(requests) > 1  # W&B's API asked the server, after kiln's key check
    assert not Path("runs").exists()


@pytest.mark.slow
def test_online_a_wandb_version_is_downloaded_through_the_artifact_cache_and_tested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    main(["fit", *LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"])
    best = next(Path("runs/digits").glob("*/checkpoints/best-*.ckpt"))
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_ARTIFACT_DIR", str(tmp_path / "downloads"))
    reference = "wandb:me/kiln/model-1a2b3c4d:best"
    with fake_wandb.serving("me", "kiln", "model-1a2b3c4d", "best", 3, best.read_bytes()) as (url, asked):
        monkeypatch.setenv("WANDB_BASE_URL", url)
        main(["test", "--ckpt_path", reference, "--trainer.logger", "false"])
        downloaded = tmp_path / "downloads" / "model-1a2b3c4d:v3" / "model.ckpt"
        assert f"--ckpt_path {reference}: {downloaded} (W&B version v3" in capsys.readouterr().err
        assert downloaded.read_bytes() == best.read_bytes() and asked.count("GET /files/model.ckpt") == 1
        downloaded.unlink()
        main(["predict", "--ckpt_path", reference, "--trainer.logger", "false"])
    assert downloaded.read_bytes() == best.read_bytes()
    assert asked.count("GET /files/model.ckpt") == 1  # the second time, from W&B's artifact cache
    assert asked.count("ArtifactMembershipByName") == 2  # each command asked which file the alias names now


@pytest.mark.slow
def test_a_sweeps_storage_password_in_either_form_appears_in_no_file_and_no_line(
    postgres_url: str, tmp_path: Path
) -> None:
    """A sweep's own W&B report run recorded the command line, `--storage postgresql://kiln:<password>@…` whole
    (`wandb sync` would upload it); a password given as `?password=` was printed in the error line."""
    import psycopg

    password, key, dotenv = "hunter2-s3cr3t-pw", "env-s3cr3t-0123456789abcdef0123456789abcdef0123", "dotenv-s3cr3t-x"
    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as connection:
        connection.execute(f"CREATE ROLE planted LOGIN SUPERUSER PASSWORD '{password}'")
    server = postgres_url.split("@", 1)[1]
    (tmp_path / ".env").write_text(f"KILN_TEST_DB_TOKEN={dotenv}\n")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": key}
    for form, storage in [("user", f"postgresql+psycopg://planted:{password}@{server}"),
                          ("query", f"postgresql+psycopg://planted@{server}?password={password}")]:  # fmt: skip
        spec = tmp_path / f"{form}.yaml"
        spec.write_text(yaml.safe_dump({"name": form, "n_trials": 1, "pruner": "none", "args": [*LIMIT,
                        "--trainer.enable_progress_bar=false"], "space": {"model.init_args.optimizer.init_args.lr":
                        {"low": 1e-3, "high": 1e-2, "log": True}}}))  # fmt: skip
        done = forkserver.run([sys.executable, "-m", "kiln", "sweep", "-c", str(spec), "--storage", storage],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        wrong = storage.replace(password, "WrongQp77")  # the error line of a refused password
        refused = forkserver.run([sys.executable, "-m", "kiln", "sweep", "-c", str(spec), "--storage", wrong],
                                 cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert refused.returncode == 2 and "password authentication failed" in refused.stderr, refused.stderr[-2000:]
        for secret in (password, "WrongQp77", key, dotenv):
            assert secret not in done.stdout + done.stderr + refused.stdout + refused.stderr, (form, secret)
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert sum(p.suffix == ".wandb" for p in files) == 4  # each sweep's trial and its report run
    for path in files:
        content = path.read_bytes()
        for secret in (password, key, dotenv):
            assert secret.encode() not in content, (path, secret)
