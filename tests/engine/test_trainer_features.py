"""Trainer features checked by their effect: accumulation, clipping, precision, DDP, compile, checkpointing."""

from __future__ import annotations

import copy
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import forkserver
import pytest
import torch
from helpers import CONFIGS, PROBES, callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment

from kiln.callbacks import ChannelsLast, GradNormMonitor
from kiln.cli import build_cli
from kiln.cli.devices import fall_back_from_bf16
from research.models import Classifier
from research.nets import ResNet, SmallCNN

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# An MLP (no BatchNorm, no dropout), plain SGD, no augmentation, data in a fixed order: any two runs
# that see the same samples per optimizer step must end with the same weights.
EXACT = [
    "--model.init_args.net", "research.nets.MLP",
    "--data", "probes.FixedOrderDigits", "--data.num_workers", "0", "--data.train_transforms", "[]",
    "--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.lr", "0.1",
    "--model.init_args.scheduler", "null", "--trainer.logger", "false",
]  # fmt: skip


def trained_state(*args: str) -> dict[str, torch.Tensor]:
    cli = build_cli([*EXACT, *args], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


def test_accumulating_4_batches_of_8_equals_one_batch_of_32() -> None:
    one_step = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"]
    accumulated = trained_state(*one_step, "--data.batch_size", "8", "--trainer.accumulate_grad_batches", "4")
    full = trained_state(*one_step, "--data.batch_size", "32")
    initial = trained_state("--trainer.max_steps", "0", "--trainer.limit_val_batches", "0")
    for key in full:
        torch.testing.assert_close(accumulated[key], full[key], atol=1e-6, rtol=0)
    assert any(not torch.equal(full[k], initial[k]) for k in full)  # the step did change the weights


def test_gradient_clipping_bounds_the_norm_the_optimizer_sees() -> None:
    clip = 0.05
    args = [*EXACT, "--model.init_args.optimizer", "probes.RecordingSGD", "--trainer.max_steps", "5"]
    cli = build_cli([*args, "--trainer.gradient_clip_val", str(clip), "--trainer.limit_val_batches", "0"], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seen = cli.trainer.optimizers[0].seen_norms  # type: ignore[attr-defined]
    monitor = callback(cli, GradNormMonitor)
    raw = monitor._past + [float(t) for t in monitor._pending]  # measured before clipping
    assert len(seen) == 5 and len(raw) == 5
    assert all(r > clip for r in raw)  # clipping had something to do
    assert all(s <= clip * (1 + 1e-5) for s in seen)
    assert seen == pytest.approx([clip] * 5, rel=1e-4)  # norm clipping rescales to exactly the bound


@pytest.mark.slow
def test_bf16_mixed_runs_matmuls_in_bf16_and_still_learns() -> None:
    # few steps: bf16 is slow on a CPU without bf16 instructions (benchmarks/README.md); chance is 0.1
    args = ["--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "15"]
    cli = build_cli([*args, "--trainer.logger", "false"], run=False)
    dtypes: set[torch.dtype] = set()
    for module in cli.model.net.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            module.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in cli.model.parameters())  # master weights stay fp32
    assert float(cli.trainer.callback_metrics["val/acc"]) > 0.5


@pytest.mark.slow
def test_an_in_process_ddp_run_leaves_no_process_group_nor_port_behind(tmp_path: Path) -> None:
    before = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "OMP_NUM_THREADS")}
    threads = torch.get_num_threads()
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "1", "--trainer.accelerator", "cpu"]
    build_cli(["fit", "-c", str(CONFIGS / "debug" / "fast_dev_run.yaml"), *ddp, "--trainer.logger", "false"])
    assert not torch.distributed.is_initialized()  # its store listened on MASTER_PORT
    assert {key: os.environ.get(key) for key in before} == before and torch.get_num_threads() == threads
    # a DDP run started from this process afterwards (as on a GPU: an in-process 1-GPU run, then a subprocess)
    cmd = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--trainer.logger",
           "false", "--trainer.fast_dev_run", "true", "--run.root", str(tmp_path / "runs")]  # fmt: skip
    done = forkserver.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]  # was EADDRINUSE on the port the first run left exported


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_matches_one_process(tmp_path: Path) -> None:
    dump = tmp_path / "ranks"
    common = [*EXACT, "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "1.0"]
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": PROBES}
    ddp_args = ["-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--data.batch_size", "32",
                "--trainer.logger", "lightning.pytorch.loggers.WandbLogger", "--run.test_ckpt", "last",
                "--trainer.callbacks+=probes.SaveRankWeights", f"--trainer.callbacks.dirpath={dump}",
                "--run.root", str(tmp_path / "runs")]  # fmt: skip
    done = forkserver.run(
        [sys.executable, "-m", "kiln", "fit", *common, *ddp_args], capture_output=True, text=True, env=env, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (torch.load(dump / f"rank{r}.pt", weights_only=True, map_location="cpu") for r in (0, 1))
    for key in rank0["state"]:
        assert torch.equal(rank0["state"][key], rank1["state"][key])  # DDP kept the replicas identical
    # one run folder, one W&B run, checkpoints written once
    (run_dir,) = (tmp_path / "runs" / "fixed_order_digits").iterdir()  # named after its data class
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    assert sorted(p.name.split("-")[0] for p in (run_dir / "checkpoints").iterdir()) == ["best", "last.ckpt"]

    single = build_cli([*common, "--data.batch_size", "64"], run=False)  # same global batch
    single.trainer.fit(single.model, datamodule=single.datamodule)
    for key, value in single.model.state_dict().items():
        torch.testing.assert_close(rank0["state"][key], value, atol=1e-5, rtol=1e-4)
    # epoch metrics were reduced over both halves of the validation set, not rank 0's half alone
    for metric in ("val/loss", "val/acc"):
        assert rank0["metrics"][metric] == pytest.approx(float(single.trainer.callback_metrics[metric]), abs=1e-4)
        assert rank1["metrics"][metric] == pytest.approx(rank0["metrics"][metric], abs=1e-6)
    # the test after fit on 2 ranks scores each of the 359 test digits once (padded, it scored 360: 41/360 for 41/359)
    (ddp_test,) = json.loads((run_dir / "metrics.json").read_text())["test"]
    alone = build_cli(["test", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), "--trainer.logger", "false",
                       "--run.root", str(tmp_path / "alone")])  # fmt: skip
    for metric in ("test/acc", "test/loss"):
        assert ddp_test["metrics"][metric] == pytest.approx(float(alone.trainer.callback_metrics[metric]), abs=1e-6)
    # predict on 2 ranks, on-device data: each rank predicts its half (it predicted all 359 on both), rank 0 merges
    # them into one predictions.csv in dataset order (it held rank 0's 180 rows and said "180 rows")
    predict = [sys.executable, "-m", "kiln", "predict", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--ckpt_path",
               str(run_dir / "checkpoints" / "last.ckpt"), "--data.on_device", "true", "--trainer.logger", "false",
               "--run.root", str(tmp_path / "runs")]  # fmt: skip
    predicted = forkserver.run(predict, capture_output=True, text=True, env=env, timeout=400)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    (ddp_dir,) = (tmp_path / "runs" / "fixed_order_digits").glob("predict-*")  # the checkpoint's data names it
    assert f"predictions: {ddp_dir / 'predictions.csv'} (359 rows from 2 of 2 ranks, in dataset order)" in (
        predicted.stderr.splitlines())  # fmt: skip
    assert sorted(p.name for p in ddp_dir.glob("*.csv")) == ["predictions.csv"]  # no rank file left
    alone.trainer.predict(alone.model, datamodule=alone.datamodule)  # one process, the DataLoader path
    with (
        (ddp_dir / "predictions.csv").open() as f,
        (Path(alone.trainer.default_root_dir) / "predictions.csv").open() as g,
    ):
        ddp_rows, rows = list(csv.DictReader(f)), list(csv.DictReader(g))
    assert [r["index"] for r in ddp_rows] == [r["index"] for r in rows] == [str(i) for i in range(359)]
    assert [r["predicted"] for r in ddp_rows] == [r["predicted"] for r in rows]
    assert [float(r["p3"]) for r in ddp_rows] == pytest.approx([float(r["p3"]) for r in rows], abs=1e-5)
    # the test's confident mistakes are the whole test set's (they were rank 0's half's)
    (table,) = run_dir.glob("wandb/offline-run-*/files/media/table/test/confident_mistakes_*.table.json")
    shown = [row[3] for row in json.loads(table.read_text())["data"]]
    mistakes = [max(float(r[f"p{c}"]) for c in range(10)) for r in rows if r["predicted"] != r["label"]]
    assert shown == pytest.approx(sorted(mistakes, reverse=True)[:16], abs=2e-4)


@pytest.mark.slow
def test_under_ddp_a_plain_datamodules_repeated_evaluation_samples_are_said_and_recorded(tmp_path: Path) -> None:
    """Lightning pads an evaluation set that brought no distributed sampler to a multiple of the ranks: a plain
    datamodule's 179 test digits were scored as 180 on 2 ranks, with a generic warning and nothing recorded."""
    command = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--data",
               "probes.ShardedValDigits", "--model.init_args.num_classes", "10",
               "--model.init_args.net.init_args.in_channels", "1", "--trainer.max_epochs", "1",
               "--trainer.limit_train_batches", "4", "--trainer.logger", "false",
               "--run.root", str(tmp_path)]  # fmt: skip
    done = forkserver.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": PROBES},
                          timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = (done.stdout + done.stderr).splitlines()
    assert [line for line in printed if "under DDP" in line] == [  # the odd validation set, sharded: no line
        "test under DDP: Lightning repeats 1 of the 179 test samples so that 2 ranks get equal shares, and test/ "
        "metrics count 180; for each sample once, give test_dataloader's DataLoader "
        "sampler=kiln.data.EvaluationShard(dataset, trainer.world_size, trainer.global_rank)"
    ]
    assert "Using `DistributedSampler` with the dataloaders" not in done.stderr  # Lightning's, said either way
    (run_dir,) = (tmp_path / "sharded_val_digits").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["repeated_samples"] == {"test": {"samples": 179, "counted": 180}}


@pytest.mark.slow
def test_compiled_network_learns_logs_and_loads_uncompiled() -> None:
    """What the callback owns, on ``aot_eager``: the graphs inductor would get (forward and backward, one per batch
    shape) without inductor's C++ build, which a clean clone pays in full (benchmarks/README.md); the GPU test
    compiles with inductor."""
    short = ["--trainer.max_epochs", "5", "--trainer.logger", "false"]  # compiling is most of the time: few epochs
    eager_run = build_cli(["fit", *short, "--run.name", "eager"])
    cli = build_cli(["fit", "--trainer.callbacks+", "kiln.callbacks.Compile", "--trainer.callbacks.backend",
                     "aot_eager", *short])  # fmt: skip
    assert cli.test_metrics is not None and eager_run.test_metrics is not None
    assert cli.test_metrics["test/acc"] >= 0.97  # it learns ...
    assert abs(cli.test_metrics["test/acc"] - eager_run.test_metrics["test/acc"]) <= 2 / 359  # ... as eager does
    checkpoint = cli.trainer.checkpoint_callback
    assert (
        isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None
    )  # self.log("val/loss") worked
    best = checkpoint.best_model_path
    state = torch.load(best, weights_only=True, map_location="cpu")["state_dict"]
    assert not any("_orig_mod" in key for key in state)
    eager = Classifier.load_from_checkpoint(best).eval()
    assert isinstance(eager.net, SmallCNN)
    assert cli.model._compiled_call_impl is not None and eager._compiled_call_impl is None
    x = torch.randn(8, 1, 8, 8)
    cli.model.eval()
    with torch.inference_mode():
        torch.testing.assert_close(eager(x), cli.model(x), atol=1e-4, rtol=1e-4)
    # a graph per batch shape: the epochs' last, smaller batches (42 train, 52 val, 39 test) did not turn the
    # network into a shape-generic graph, which would serve an unseen batch size without compiling
    with torch.compiler.set_stance("fail_on_recompile"), torch.inference_mode(), pytest.raises(RuntimeError):
        cli.model(torch.randn(33, 1, 8, 8))


@pytest.mark.slow
def test_the_speed_callbacks_serve_a_module_that_is_not_the_classifier() -> None:
    """Compile and ChannelsLast were Classifier arguments; as callbacks they serve any LightningModule (here the
    regression example's: feature vectors, no classes), ChannelsLast stepping aside for its non-image inputs."""
    cli = build_cli(["fit", "-c", str(CONFIGS / "experiment" / "friedman.yaml"), "--trainer.max_epochs", "1",
                     "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1", "--trainer.logger",
                     "false", "--run.test_after_fit", "false", "--trainer.callbacks+", "kiln.callbacks.Compile",
                     "--trainer.callbacks.backend", "aot_eager", "--trainer.callbacks+",
                     "kiln.callbacks.ChannelsLast"])  # fmt: skip
    assert type(cli.model).__name__ == "Regressor" and cli.trainer.state.finished
    assert cli.model._compiled_call_impl is not None  # its forward ran compiled
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])


def test_activation_checkpointing_keeps_loss_gradients_and_batchnorm_stats() -> None:
    torch.manual_seed(0)
    plain = ResNet(in_channels=3, num_classes=10, blocks_per_stage=2)
    checkpointed = copy.deepcopy(plain)
    checkpointed.activation_checkpointing = True
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    losses = []
    for net in (plain, checkpointed):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    for buffer, twin in zip(plain.buffers(), checkpointed.buffers(), strict=True):
        assert torch.equal(buffer, twin)  # running stats updated once, not again during recomputation


def test_channels_last_changes_layout_not_results() -> None:
    torch.manual_seed(0)
    net = ResNet(in_channels=3, num_classes=10, blocks_per_stage=1)
    plain = Classifier(net=copy.deepcopy(net), num_classes=10).eval()
    nhwc = Classifier(net=copy.deepcopy(net), num_classes=10).eval()
    seen: list[bool] = []
    nhwc.net.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    ChannelsLast().setup(Mock(datamodule=None), nhwc, "fit")  # no declared shape: taken for images
    assert all(p.is_contiguous() for p in net.parameters())
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in nhwc.net.parameters() if p.ndim == 4)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(plain(x), nhwc(x), atol=1e-5, rtol=1e-4)
    assert seen == [True]  # the input reached the network in NHWC layout


def test_bf16_falls_back_to_fp16_on_gpus_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from jsonargparse import Namespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    trainer = Namespace(precision="bf16-mixed", accelerator="gpu")
    assert "Tesla V100 has no bf16" in (fall_back_from_bf16(trainer) or "")
    assert trainer.precision == "16-mixed"
    cpu = Namespace(precision="bf16-mixed", accelerator="cpu")
    assert fall_back_from_bf16(cpu) is None and cpu.precision == "bf16-mixed"


def test_slurm_preset_takes_the_cluster_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
                       "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                       "SLURM_NODELIST": "localhost", "SLURM_JOB_NAME": "kiln"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    # as shipped, on a CPU node (it asked for a GPU and SyncBatchNorm: scripts/slurm.sbatch adds ddp.yaml for GPUs)
    cli = build_cli(["fit", "-c", str(CONFIGS / "trainer" / "slurm.yaml"), "--trainer.devices", "1",
                     "--trainer.fast_dev_run", "true"])  # fmt: skip
    environment = cli.trainer.strategy.cluster_environment  # type: ignore[attr-defined]
    assert isinstance(environment, SLURMEnvironment)
    assert not environment.auto_requeue  # PreemptionCheckpoint requeues, at a step boundary
    assert cli.trainer.default_root_dir.endswith("digits/job-4242")  # a requeued job finds its folder


def test_the_suite_keeps_to_the_cpu_unless_asked_for_the_gpu_tests() -> None:
    """On a GPU machine (an H100) `make test` trained on the GPU (``accelerator: auto``), and 5 tests that compare
    runs bit for bit or feed CPU tensors failed; `make test-gpu` (``-m gpu``) is where the GPU is tested."""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and not torch.cuda.is_available()


# GPU variants: `make test-gpu` on a CUDA machine.
@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_gpu_mixed_precision_learns(precision: str) -> None:
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    args = ["-c", str(CONFIGS / "trainer" / "gpu.yaml"), "--trainer.precision", precision]
    cli = build_cli([*args, "--trainer.max_epochs", "5", "--trainer.logger", "false"], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    scaler = getattr(cli.trainer.precision_plugin, "scaler", None)
    assert (scaler is not None) == (precision == "16-mixed")  # fp16 needs loss scaling, bf16 does not
    assert float(cli.trainer.callback_metrics["val/acc"]) > 0.9


@pytest.mark.gpu
@CUDA
def test_gpu_compile_channels_last_bf16() -> None:
    args = ["-c", str(CONFIGS / "trainer" / "gpu.yaml"), "--trainer.callbacks+", "kiln.callbacks.Compile"]
    cli = build_cli(["fit", *args, "--trainer.callbacks+", "kiln.callbacks.ChannelsLast", "--trainer.max_epochs", "10"])
    assert cli.test_metrics is not None and cli.test_metrics["test/acc"] >= 0.98
    assert cli.model._compiled_call_impl is not None
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in cli.model.parameters() if p.ndim == 4)
    assert cli.trainer.precision == "bf16-mixed"  # the GPU preset's autocast, under compile and channels-last


@pytest.mark.gpu
@CUDA
def test_gpu_ddp_preset_on_one_gpu(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.devices", "1",
           "-c", str(CONFIGS / "debug" / "fast_dev_run.yaml"), "--run.root", str(tmp_path)]  # fmt: skip
    done = forkserver.run(cmd, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_with_channels_last_each_compiled_graph_is_the_networks_forward() -> None:
    """ChannelsLast's layout change was compiled as a graph of its own, dispatched beside the forward's each step
    (on an H200: 2 graphs a call, the template at 0.64x the ceiling); it runs before the compiled forward."""
    graphs: list[torch.fx.GraphModule] = []

    @torch._dynamo.register_backend(name="kiln_test_recording")
    def recording(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    cli = build_cli(["fit", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.logger",
                     "false", "--run.test_after_fit", "false", "--trainer.callbacks+", "kiln.callbacks.Compile",
                     "--trainer.callbacks.backend", "kiln_test_recording", "--trainer.callbacks+",
                     "kiln.callbacks.ChannelsLast"])  # fmt: skip
    assert cli.trainer.state.finished and graphs  # training and validation ran compiled
    assert all(any("conv" in str(node.target) for node in gm.graph.nodes) for gm in graphs), [g.code for g in graphs]
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in cli.model.parameters() if p.ndim == 4)
