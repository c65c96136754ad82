"""``kiln export --ckpt_path FILE --format onnx,pt2``: the trained network for serving, checked against itself.

Writes ``model.onnx`` (dynamic batch; ``kiln infer`` runs it without torch), ``model.pt2``
(``torch.export``): the module's own forward, nothing added (a classifier's logits stay logits);
``preprocess.json`` (what an input needs before the network, as the data does it) and ``parity.json``:
max absolute difference of every output against the eager model on the test split, per batch size,
and for a classifier top-1 agreement. Above the tolerance nothing is kept. Everything is written to
a temporary folder first.
"""

from __future__ import annotations

from pathlib import Path

from kiln.commands.arguments import OneLineParser, parse_command, resolved_config
from kiln.errors import UsageError
from kiln.files import load_yaml
from kiln.runs.folders import layout, run_of
from kiln.runs.picking import Pick, partial_data
from kiln.runs.reference import Reference, resolve
from kiln.wandb import checkpoints as wandb_checkpoints

FORMATS = ("onnx", "pt2")
BATCH_SIZES, TOLERANCE, SAMPLES = (1, 64), 1e-4, 1024  # the parity check's: kiln export's flags, kiln serve's


def checkpoint(given: str, files: list[str], root: str | None, name: str | None) -> Reference:
    """``--ckpt_path`` through the one resolver every command uses; ``best``, ``last`` and ``wandb:`` under the
    run.root and run.name that ``kiln fit`` resolves from the same ``-c`` files and flags (a run on part of the
    data is taken only with a ``-c`` that trains on part of it, as ``kiln test`` takes it)."""
    if not (given in ("best", "last") or wandb_checkpoints.names_a_version(given)):
        return resolve(given, ".", "", "export", Pick(None, fit=False))
    flags = [*(f for file in files for f in ("-c", file)), *(["--run.root", root] if root else []),
             *(["--run.name", name] if name else [])]  # fmt: skip
    config = load_yaml(resolved_config(flags)) or {}
    pick = Pick(partial_data(config.get("trainer") or {}), fit=False)  # a debug run's, for a debug -c only
    return resolve(given, config["run"]["root"], config["run"]["name"], "export", pick)


def default_output(checkpoint: Path) -> Path:
    """``export/`` in the checkpoint's run folder (the one with its config.yaml), else beside the file (a downloaded
    W&B version): where ``kiln export`` writes and ``kiln serve --ckpt_path`` looks."""
    run = run_of(checkpoint)
    return (run if layout(run).config.is_file() else checkpoint.parent) / "export"


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="kiln export", description="Export a trained model for serving.")
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="a checkpoint `kiln fit` wrote, best, last, or wandb:<entity>/<project>/<artifact>:<alias>",
    )
    parser.add_argument("-c", "--config", action="append", default=[], help="for best and last: the experiment's "
                        "config files, as `kiln fit -c` takes them (their run.root and run.name)")  # fmt: skip
    parser.add_argument("--run.root", dest="root", help="for best and last: run.root, as kiln fit takes it")
    parser.add_argument("--run.name", dest="name", help="for best and last: run.name, as kiln fit takes it")
    parser.add_argument("--format", default="onnx,pt2", help="onnx, pt2 or both (comma-separated)")
    parser.add_argument("--output", type=Path, help="default: export/ in the checkpoint's run folder")
    parser.add_argument(
        "--batch_sizes", default=",".join(map(str, BATCH_SIZES)), help="batch sizes the parity check runs"
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest max |difference| allowed")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="test samples the parity check uses")
    return parser


def export_command(args: list[str]) -> None:
    """``kiln export --ckpt_path FILE|best|last|wandb:… [-c FILE] [--run.root R] [--run.name N] [--format onnx,pt2]
    [--output DIR] [--batch_sizes 1,64] [--tolerance 1e-4]``."""
    options, extra = parse_command(_parser(), args)
    if options.samples < 1:
        raise UsageError(f"kiln export: --samples {options.samples}: the parity check needs 1 or more test samples")
    formats = options.format.split(",")
    if extra or not formats or not set(formats) <= set(FORMATS):
        raise UsageError(f"kiln export: --format {options.format!r}: give {' or '.join(FORMATS)} (comma-separated)")
    try:
        sizes = [int(s) for s in options.batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(f"kiln export: --batch_sizes {options.batch_sizes!r}: give positive integers, e.g. 1,64")
    found = checkpoint(options.ckpt_path, options.config, options.root, options.name)
    assert found.path is not None  # only `fit --ckpt_path last` finds none and goes on
    output = options.output or default_output(found.path)
    if output.exists():
        raise UsageError(f"kiln export: {output} exists; remove it or give another --output")
    from kiln.commands.exporting import export, say_exported  # torch: not for --help

    report = export(str(found.path), output, formats, sizes, options.tolerance, options.samples, found.version)
    say_exported(report, output, formats, options.tolerance)
