"""`make mutants`: break the engine on purpose, one promise at a time, and check a test fails for each.

Each mutant is a small edit of one file (the bug a promise guards against: a retrain for a resume, a wrong
aggregate, an export that adds a softmax, a dropped prediction row, …) and the tests that must catch it. Each runs
in a copy of the working tree, the tree itself untouched; the tests run once on the copy unbroken first, so a
mutant is killed only by a test that passes without it. Exits 1 if a mutant survives (its tests all passed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]


class Mutant(NamedTuple):
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest's arguments: the tests that must fail


E = "tests/engine/"
REPLACED = (E + "test_own_task.py", "-k", "replaced_model_checkpoint")
MUTANTS = [
    Mutant("a rerun retrains instead of resuming its checkpoint", "src/kiln/cli/engine.py",
           "        process_group.check_one_process(self.trainer.num_devices * self.trainer.num_nodes, self.inside)\n",
           "        process_group.check_one_process(self.trainer.num_devices * self.trainer.num_nodes, self.inside)\n"
           "        self.config_init[self.subcommand].ckpt_path = None\n",
           (E + "test_checkpointing.py::test_a_finished_run_whose_test_never_completed_is_tested_not_retrained",)),
    Mutant("a multirun's mean over the wrong count", "src/kiln/commands/sweep/aggregate.py",
           "    mean = sum(values) / n\n", "    mean = sum(values) / max(n - 1, 1)\n",
           (E + "test_multirun.py::test_seeds_times_a_grid_aggregate_as_numpy_does_and_a_rerun_trains_nothing",)),
    Mutant("an export that adds a softmax", "src/kiln/commands/exporting.py",
           "    classifier = isinstance(outputs, Tensor) and classifier_of(served, data, outputs) is not None\n",
           "    classifier = isinstance(outputs, Tensor) and classifier_of(served, data, outputs) is not None\n"
           "    served = nn.Sequential(served, nn.Softmax(-1)).eval()\n",
           (E + "test_export.py::test_export_agrees_with_the_eager_model_and_infer_runs_without_torch",)),
    Mutant("a prediction row dropped from each batch", "src/kiln/callbacks/predictions.py",
           "        for i, index in enumerate(indices):\n", "        for i, index in enumerate(indices[:-1]):\n",
           (E + "test_predictions.py",)),
    Mutant("a mid-epoch resume counted from a guess of the batch size", "src/kiln/callbacks/resume.py",
           "        size = self._batch_size\n",
           "        from lightning.pytorch.utilities.data import extract_batch_size\n"
           "        size = extract_batch_size(batch)\n",
           (E + "test_own_task.py", "-k", "list_of_tensors_batch")),
    Mutant("run.without applied again on a rerun of config.yaml", "src/kiln/cli/callback_list.py",
           "    config.run.without = []\n", "",
           REPLACED),
    Mutant("a replacement ModelCheckpoint left out with the one it replaces", "src/kiln/cli/callback_list.py",
           "            found |= {id(c): why for c in group[:-1] or group}\n",
           "            found |= {id(c): why for c in group}\n",
           REPLACED),
    Mutant("a test after fit that scores the last weights for the best", "src/kiln/training/testing.py",
           '    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None\n    last_file =',
           "    best = None\n    last_file =",
           REPLACED),
    Mutant("a served sample not normalised as kiln infer normalises it", "src/kiln/commands/serve.py",
           "    return model.samples(raw[None])[0], None\n", "    return raw.astype(np.float32) / 255, None\n",
           (E + "test_serve.py", "-k", "answers_are and digits")),
    Mutant("kiln serve killed by SIGTERM with requests in flight", "src/kiln/commands/serve.py",
           "    signal.signal(signal.SIGTERM, _stop_on_sigterm(os.getpid()))\n", "",
           (E + "test_serve.py", "-k", "sigterm")),
]  # fmt: skip


def copy_of_tree(into: Path) -> Path:
    """The working tree's tracked and new files (not what git ignores: .venv, runs), copied."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source, target = ROOT / name, into / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def run_tests(tree: Path, tests: tuple[str, ...]) -> bool:
    """Whether ``tests`` pass in ``tree`` (its ``src`` ahead of the installed kiln)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True).returncode == 0


def _outcome(tree: Path, mutant: Mutant) -> str:
    """``killed``, ``survived``, or why the mutant could not be tried."""
    path = tree / mutant.file
    text = path.read_text()
    if text.count(mutant.old) != 1:
        return f"not tried: its code is no longer once in {mutant.file} (update the mutant)"
    if not run_tests(tree, mutant.tests):
        return "not tried: its tests fail unbroken (fix them first)"
    path.write_text(text.replace(mutant.old, mutant.new))
    return "survived" if run_tests(tree, mutant.tests) else "killed"


def main() -> int:
    results = []
    for mutant in MUTANTS:
        with tempfile.TemporaryDirectory(prefix="kiln-mutant-") as folder:
            tree = copy_of_tree(Path(folder))
            results.append((mutant.name, _outcome(tree, mutant)))
        print(f"{results[-1][1]:>8}  {mutant.name}", flush=True)
    killed = sum(state == "killed" for _, state in results)
    print(f"{killed} of {len(results)} mutants killed")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
