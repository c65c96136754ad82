"""What a project's tests use of the engine (its public surface, README): the environment a test must not inherit."""

from kiln.process.process_group import DDP_ENV

# a run folder, a cluster job, and what Lightning's DDP set-up (and torchrun) exports: a test that inherited them
# would resume another's folder, name its sweep trials after another's job, or start DDP on another's port
INHERITED_ENV = (
    *(v for v in DDP_ENV if v != "OMP_NUM_THREADS"), "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "TORCHELASTIC_RUN_ID", "GROUP_RANK", "RANK", "LOCAL_WORLD_SIZE",
)  # fmt: skip
