"""The ranges of every number and size the API accepts, in one place (the README's "Limits" table lists
them). Beyond them a request is refused with a 422 that names the field, so that no value can overflow
the store, the scheduler's integer arrays or the kernel's limits on a command line, and no absurd request
(a 1e30-GPU job) is accepted to fail later."""

from __future__ import annotations

# A job's worker.
MAX_GPUS_PER_WORKER = 1024
MAX_CPU_PER_WORKER = 100_000  # cores
MAX_BYTES_PER_WORKER = 1 << 50  # 1 PiB: memory and GPU memory
MAX_WORKERS = 10_000
MAX_GRAD_BYTES = 1 << 50  # 1 PiB of gradients all-reduced per step
MAX_PARAMS = 1e15  # parameters of a model
MAX_GPU_MODELS = 32
MAX_NAME = 200  # job names, token names: characters
MAX_PATH = 4096  # workdir: characters (PATH_MAX)

# What a job runs. Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN) and a command line and
# environment over ARG_MAX (2 MiB by default): stay well within both.
MAX_ARGUMENT = 128 * 1024  # characters of one argument (and of a shell command)
MAX_ARGUMENTS = 4096
MAX_COMMAND = 256 * 1024  # characters of all arguments together
MAX_ENV_VARS = 1024
MAX_ENV_VALUE = 32 * 1024
MAX_ENV = 256 * 1024  # characters of all names and values together

# Durations (seconds).
DEFAULT_MAX_GRACE_S = 3600.0  # a queue's default cap on grace_period; an admin may set another per queue
MAX_GRACE_S = 7 * 86400.0  # the highest cap an admin may set
MAX_DURATION_S = 366 * 86400.0  # max_runtime, checkpoint_interval
MAX_EXPECTED_DURATION_S = 10 * 366 * 86400.0

# Queues (admin).
MAX_QUOTA_GPUS = 1_000_000
MAX_QUOTA_CPU = 100_000_000  # cores
MAX_QUOTA_BYTES = 1 << 60  # 1 EiB
MAX_QUOTAS = 64  # keys per queue
MAX_WEIGHT = 1_000_000.0
MAX_PENDING_CAP = 10_000_000

# Requests.
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a job spec at its limits fits with room
MAX_SEQ = (1 << 63) - 1  # submit_seq and other 64-bit integers
MAX_IDEMPOTENCY_KEY = 255
