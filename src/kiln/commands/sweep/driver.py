"""``kiln sweep -c configs/sweep/<name>.yaml``: ask Optuna, run each trial as ``kiln fit``, tell the result.

Trials run in this process (``build_cli``), one after another: a new process per trial would pay
the ~4 s start-up (imports) each time, against a target of 1 s overhead per trial. ``--subprocess``
runs each trial as its own ``kiln fit`` process, which DDP needs (it starts its ranks from the command
line). Every trial is a complete ``kiln fit`` with its own run folder, so presets, health checks and
resume apply.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kiln.commands.arguments import resolved_config
from kiln.commands.sweep import reporting
from kiln.commands.sweep.inprocess import describe, fit, fit_process, under_policy
from kiln.commands.sweep.report import report
from kiln.commands.sweep.reporting import MetricNotLogged
from kiln.commands.sweep.space import Sweep, flags
from kiln.commands.sweep.study import HEARTBEAT, OWNER, beating, claim, open_study, orphans, others_running, storage_for
from kiln.errors import AlreadyFinished, KilnError, UsageError
from kiln.process import stop_signals
from kiln.runs import folders, picking


def _best(values: dict[int, float], direction: str) -> float | None:
    return (min if direction == "minimize" else max)(values.values()) if values else None


def trial_name(trial: Any) -> str:
    """A trial's run name, and its folder's under the sweep's."""
    return f"trial-{trial.number:04d}"


def fit_trial_process(args: list[str], trial: Any, sweep: Sweep, sweep_dir: Path, storage: str | None) -> None:
    """The trial as its own ``kiln fit`` process, told its trial by environment (``TrialReporter`` reopens it)."""
    spec = {"file": sweep.file, "dir": str(sweep_dir), "storage": storage, "trial": trial._trial_id}
    fit_process(args, {reporting.TRIAL_ENV: json.dumps(spec)}, runs_under=sweep_dir / trial_name(trial))


def run_trial(
    study: Any, trial: Any, sweep: Sweep, sweep_dir: Path, resume: bool = False, storage: str | None = None,
    subprocess_trials: bool = False,
) -> str:  # fmt: skip
    """One trial as ``kiln fit``; the state it ends in (COMPLETE, PRUNED, FAIL) is told to the study."""
    trial.set_user_attr("owner", OWNER)
    values = {param.key: param.suggest(trial) for param in sweep.space}
    name = trial_name(trial)
    trial.set_user_attr("run", str(sweep_dir / name))
    args = [*sweep.args, *flags(values), f"--run.root={sweep_dir}", f"--run.name={name}",
            "--run.test_after_fit=false", "--run.summary=false",  # the sweep prints a line per trial, and its table
            *([f"--ckpt_path={last}"] if resume and (last := _cut_short(sweep_dir / name)) else [])]  # fmt: skip

    def attempt() -> None:
        with beating(trial, sweep.stale_after), contextlib.suppress(AlreadyFinished):  # trained before: it stands
            if subprocess_trials:  # its reporter reopens the trial (reporting.TRIAL_ENV)
                reporter = ["--trainer.callbacks+=kiln.commands.sweep.reporting.TrialReporter",
                            f"--trainer.callbacks.metric={sweep.metric}"]  # fmt: skip
                fit_trial_process([*args, *reporter], trial, sweep, sweep_dir, storage)
            else:
                fit(args, inside="kiln sweep", callbacks=[reporting.TrialReporter.of(trial, sweep.metric)])

    failed: list[str] = []
    os.environ["WANDB_RUN_GROUP"] = sweep.name  # every trial's W&B run in the sweep's group
    started = time.monotonic()
    try:
        under_policy(name, attempt, lambda line: failed.append(_fail(study, trial, line)), fatal=(MetricNotLogged,))
    finally:
        os.environ.pop("WANDB_RUN_GROUP", None)
    if failed:
        return "FAIL"
    trial.set_user_attr("seconds", round(time.monotonic() - started, 2))
    return _tell_result(study, trial, sweep, sweep_dir / name, values)


def _tell_result(study: Any, trial: Any, sweep: Sweep, runs: Path, values: dict[str, Any]) -> str:
    """What the finished trial's fit reported, told to the study (PRUNED, COMPLETE, or FAIL without the metric)
    and said in one line; its run folder's status says it too."""
    from optuna.trial import TrialState

    recorded = study.get_trials(deepcopy=False)[trial.number]  # what the reporter wrote, here or in the child
    reported = recorded.intermediate_values
    if recorded.user_attrs.get("pruned"):
        study.tell(trial, state=TrialState.PRUNED)
        epoch = max(reported)
        line = f"pruned after epoch {epoch} ({sweep.metric} {reported[epoch]:.4f})"
        _tell_run(runs, f"the sweep {line}")
        print(f"{runs.name}: {line}", file=sys.stderr)
        return "PRUNED"
    best = _best(reported, sweep.direction)
    if best is None:
        _tell_run(runs, f"the sweep failed it: {sweep.metric} was never logged in validation")
        return _fail(study, trial, f"{sweep.metric} was never logged in validation")
    study.tell(trial, best)
    print(f"{runs.name}: {sweep.metric} {best:.4f} ({describe(values)})", file=sys.stderr)
    return "COMPLETE"


def _cut_short(runs: Path) -> Path | None:
    """The training state a resumed trial goes on from: its newest, whichever array task or host wrote it."""
    latest = picking.latest_checkpoint(runs.parent, runs.name, any_job=True)
    if latest is None:
        print(f"{runs.name}: no checkpoint yet: it starts over", file=sys.stderr)
    return latest


def _tell_run(runs: Path, line: str) -> None:
    """What the sweep made of a trial whose fit finished, beside ``finished`` in its run folder's status
    (``kiln.results`` lists it): a pruned run's numbers are those of a cut run."""
    statuses = [status for status in (folders.layout(run).status for run in runs.glob("*")) if status.is_file()]
    if statuses:
        folders.record_status("finished", line, max(statuses, key=lambda status: status.stat().st_mtime).parent)


def _fail(study: Any, trial: Any, message: str) -> str:
    """Record the trial as FAIL with its one-line reason, and say so."""
    from optuna.trial import TrialState

    trial.set_user_attr("error", message)
    study.tell(trial, state=TrialState.FAIL)
    print(f"{trial_name(trial)}: FAIL: {message}", file=sys.stderr)
    return "FAIL"


def check_space(sweep: Sweep, sweep_dir: Path) -> None:
    """Every space key, and the fit arguments, must parse as ``kiln fit`` takes them: a misspelt key would fail
    every trial, after using the study up. Checked with each dimension's first value, before any trial."""
    first: dict[str, Any] = {}
    for p in sweep.space:
        first[p.key] = (p.choices or [None])[0] if p.kind == "categorical" else p.low
        first[p.key] = int(p.low or 0) if p.kind == "int" else first[p.key]
    try:
        resolved_config([*sweep.args, *flags(first), f"--run.root={sweep_dir}", "--run.name=check"])
    except UsageError as err:
        raise UsageError(f"sweep {sweep.name}: {err} (a trial's settings, {describe(first)})") from None


def refuse_changed_space(sweep: Sweep, study: Any) -> None:
    """The sweep file's space must be the one the study's trials were drawn from: a changed range or scale would
    stop a trial at its draw (Optuna refuses another log setting) or mix two searches in one study."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.distributions]
    if not trials:
        return
    before = trials[-1].distributions
    now = {p.key: p.distribution() for p in sweep.space}
    changed = [f"{key}: {_shown(before.get(key))} -> {_shown(now.get(key))}"
               for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]  # fmt: skip
    if changed:
        raise UsageError(
            f"{sweep.file}: the search space of study {sweep.name!r} changed since its trials ran "
            f"({'; '.join(changed)}): restore the file, or give the sweep another name (a new study)"
        )


def _shown(distribution: Any) -> str:
    return "(absent)" if distribution is None else repr(distribution).replace("Distribution", "")


BETWEEN = "kiln sweep stopped between trials; the same command goes on from there"
COUNTED = ("COMPLETE", "PRUNED", "RUNNING")  # what n_trials counts: a failed trial does not use it up


def _counted(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=tuple(TrialState[s] for s in COUNTED)))


def resume_orphans(study: Any, sweep: Sweep, sweep_dir: Path, storage: str | None, subprocess_trials: bool) -> None:
    """Resume, each in its own folder from its last.ckpt, the trials whose driver is gone (here or elsewhere)."""
    import optuna

    for orphan in orphans(study):  # optuna has no public call that reopens a trial: Trial(study, _trial_id)
        reopened = optuna.trial.Trial(study, orphan._trial_id)
        if not claim(study, reopened):
            print(f"{trial_name(orphan)}: another driver took it over", file=sys.stderr)
            continue
        print(f"{trial_name(orphan)}: resuming (its driver is gone)", file=sys.stderr)
        run_trial(study, reopened, sweep, sweep_dir, resume=True, storage=storage, subprocess_trials=subprocess_trials)
        stop_signals.stop_here(BETWEEN)


def wait_for_others(study: Any, sweep: Sweep, sweep_dir: Path, storage: str | None, subprocess_trials: bool) -> None:
    """Stay while other drivers run trials, resuming any whose driver dies: a worker that exited as soon as it had
    nothing to start left a dead worker's trial RUNNING, for a driver started much later."""
    poll = min(5.0, sweep.stale_after / 5)  # a worker leaves within seconds of the last trial
    check = min(HEARTBEAT, sweep.stale_after / 5)  # orphans (squeue for SLURM tasks): as often as a heartbeat beats
    if running := others_running(study):
        names = ", ".join(trial_name(t) for t in running)
        print(f"{sweep.name}: waiting for {names}, which other drivers run: one whose driver dies is resumed here "
              f"({sweep.stale_after:g} s after its last heartbeat)", file=sys.stderr)  # fmt: skip
    due = time.monotonic() + check
    while running:
        until = time.monotonic() + poll
        while time.monotonic() < until:  # a stop signal ends the wait within a second
            stop_signals.stop_here(f"{BETWEEN} (it was waiting for other drivers' trials)")
            time.sleep(min(1.0, poll))
        if time.monotonic() >= due:
            resume_orphans(study, sweep, sweep_dir, storage, subprocess_trials)
            due = time.monotonic() + check
        running = others_running(study)


def run_sweep(sweep: Sweep, root: Path, storage: str | None = None, subprocess_trials: bool = False) -> Any:
    """Run trials until the study holds ``n_trials`` complete, pruned or running ones, resuming orphaned ones
    first; failed trials do not count, up to ``n_trials`` of them in one run of the command."""
    from optuna.trial import TrialState

    sweep_dir = root / sweep.name
    study = open_study(sweep, storage_for(sweep_dir, storage))
    refuse_changed_space(sweep, study)
    check_space(sweep, sweep_dir)
    resume_orphans(study, sweep, sweep_dir, storage, subprocess_trials)
    if not study.get_trials(deepcopy=False):
        for values in sweep.enqueue:  # first, the settings the sweep file names
            study.enqueue_trial(values)
    if _counted(study) >= sweep.n_trials:
        print(f"{sweep.name}: the study holds its {sweep.n_trials} trials (complete, pruned or running): none to "
              "start; give --n_trials or n_trials more to run more", file=sys.stderr)  # fmt: skip
    states: list[str] = []
    while _counted(study) < sweep.n_trials and states.count("FAIL") < sweep.n_trials:
        stop_signals.stop_here(BETWEEN)
        trial = study.ask()
        if _counted(study) > sweep.n_trials:  # another worker took the last one meanwhile (this one counts too)
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.FAIL)
            break
        states.append(run_trial(study, trial, sweep, sweep_dir, storage=storage, subprocess_trials=subprocess_trials))
        resume_orphans(study, sweep, sweep_dir, storage, subprocess_trials)  # a worker died meanwhile, anywhere
    wait_for_others(study, sweep, sweep_dir, storage, subprocess_trials)
    if states and states.count("FAIL") == len(states):
        report(study, sweep, sweep_dir)
        raise KilnError(f"sweep {sweep.name}: every trial this run started failed ({len(states)}); each one's line "
                        "above says why")  # fmt: skip
    return study
