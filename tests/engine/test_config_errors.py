"""A config that does not parse is one line naming the file, the full key, the value and the nearest valid key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import forkserver
import pytest

from kiln.commands.boundary import main

FILES = {
    "monitr.yaml": "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
    "      init_args:\n        monitr: val/acc\n",
    "appended.yaml": "trainer:\n  callbacks+:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
    "      init_args:\n        monitr: val/acc\n",
    "batchsize.yaml": "data:\n  init_args:\n    batchsize: 32\n",
    "lr.yaml": "model:\n  init_args:\n    optimizer:\n      init_args:\n        lr: fast\n",
    "net.yaml": "model:\n  init_args:\n    net:\n      class_path: research.nets.SmallCN\n",
    "top.yaml": "trainer:\n  max_epoch: 3\n",
    "broken.yaml": "trainer:\n  max_epochs: [1\n",
}
CASES = {
    "unknown_argument_in_a_listed_callback": (
        ["-c", "monitr.yaml"],
        "monitr.yaml: trainer.callbacks[0].init_args.monitr: ModelCheckpoint has no argument monitr; "
        "did you mean monitor?",
    ),
    "unknown_argument_in_an_appended_callback": (  # it named neither the file nor the entry
        ["-c", "appended.yaml"],
        "appended.yaml: trainer.callbacks+[0].init_args.monitr: EarlyStopping has no argument monitr; "
        "did you mean monitor?",
    ),
    "unknown_data_argument": (
        ["-c", "batchsize.yaml"],
        "batchsize.yaml: data.init_args.batchsize: DigitsDataModule has no argument batchsize; "
        "did you mean batch_size?",
    ),
    "wrong_type_two_classes_deep": (
        ["-c", "lr.yaml"],
        "lr.yaml: model.init_args.optimizer.init_args.lr: 'fast' given, expected float",
    ),
    "misspelt_class_path": (
        ["-c", "net.yaml"],
        "net.yaml: model.init_args.net.class_path: no class research.nets.SmallCN; did you mean "
        "research.nets.SmallCNN?",
    ),
    "unknown_top_level_key": (["-c", "top.yaml"], "top.yaml: trainer.max_epoch: no such setting; did you mean "
                              "trainer.max_epochs?"),
    "yaml_syntax": (["-c", "broken.yaml"], "broken.yaml: line 3, column 1: not valid YAML"),
    "missing_file": (["-c", "nowhere.yaml"], "nowhere.yaml: no such file"),
    "flag_of_the_wrong_type": (["--trainer.max_epochs", "abc"], "--trainer.max_epochs: 'abc' given, expected int"),
    "flag_out_of_range": (["--data.init_args.batch_size", "-5"], "--data.init_args.batch_size: '-5' given, "
                          "expected PositiveInt"),
    "misspelt_flag": (["--trainer.max_epoch", "3"], "--trainer.max_epoch: no such setting; did you mean "
                      "trainer.max_epochs?"),
    "misspelt_class_in_a_flag": (["--model.init_args.optimizer", "torch.optim.Adamm"],
                                 "--model.init_args.optimizer: no class torch.optim.Adamm; did you mean "
                                 "torch.optim.Adam?"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "line"), CASES.values(), ids=CASES.keys())
def test_a_config_mistake_is_one_line_that_names_where_and_the_fix(
    args: list[str], line: str, capsys: pytest.CaptureFixture
) -> None:
    for name, text in FILES.items():
        Path(name).write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args])
    assert exit_.value.code == 2
    printed = capsys.readouterr().err
    assert len(printed.splitlines()) == 1, printed  # no usage, no nested alternatives
    assert printed.startswith(f"error: {line}"), printed
    assert not Path("runs").exists()


def test_a_mistake_in_a_secret_never_echoes_it(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    args = ["--model.class_path", "faulty.WithApiKey", "--model.init_args.api_keys", '{"hf": ["s3cr3t-in-a-list"]}']
    with pytest.raises(SystemExit):
        main(["fit", *args])
    (printed,) = capsys.readouterr().err.splitlines()
    assert printed.startswith("error: --model.init_args.api_keys: <redacted") and "s3cr3t" not in printed


@pytest.mark.slow
def test_the_real_command_prints_one_line_and_help_still_prints_usage(tmp_path: Path) -> None:
    Path("monitr.yaml").write_text(FILES["monitr.yaml"])
    env = {**os.environ, "WANDB_MODE": "offline"}
    wrong = forkserver.run([sys.executable, "-m", "kiln", "fit", "-c", "monitr.yaml"], capture_output=True, text=True,
                           env=env, timeout=120)  # fmt: skip
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.splitlines() == [
        "error: monitr.yaml: trainer.callbacks[0].init_args.monitr: ModelCheckpoint has no argument monitr; "
        "did you mean monitor?"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["monitr.yaml"]  # nothing written
    helped = forkserver.run([sys.executable, "-m", "kiln", "fit", "--help"], capture_output=True, text=True, env=env,
                            timeout=120)  # fmt: skip
    assert helped.returncode == 0 and helped.stdout.startswith("usage: ") and "--trainer.max_epochs" in helped.stdout
