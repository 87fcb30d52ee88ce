"""The tables of the SQL store, as SQLAlchemy Core metadata.

The migrations in `migrations/versions` create these tables; a test compares the migrated database with
this metadata, so the two cannot drift apart.

Each job is one row: its whole `JobRecord` as JSON (`record`, written by `codec`) plus copies of the
fields that queries filter or order on (`seq`, `queue`, `name`, `state`, `version`, `priority`, `username`),
kept in step with the
JSON by every write. `seq` is the submission order (`Job.submit_seq`), handed out from the `submit_seq`
counter in `meta`; see `sql.py` for why a counter row and not an autoincrement.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only autoincrements an `INTEGER PRIMARY KEY`; PostgreSQL gets a 64-bit identity.
AutoId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("seq", sa.BigInteger(), nullable=False, unique=True),
    sa.Column("queue", sa.String(), nullable=False),
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("submitted_at", sa.Float(), nullable=False),
    sa.Column("record", sa.JSON(), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("username", sa.String(), nullable=False, server_default=""),  # who submitted it (token name)
    sa.Column("array_id", sa.String(), nullable=False, server_default=""),  # the array of a task, else ""
    # The loop reads active jobs in submission order; the API pages by queue, state, name or submitter, newest
    # first; `explain` counts the waiting jobs ahead of one in its queue (higher priority, then earlier).
    sa.Index(None, "state", "seq"),
    sa.Index(None, "queue", "seq"),
    sa.Index(None, "name", "seq"),
    # Also what a queue's pending jobs are counted on at each submit, when an admin capped them.
    sa.Index(None, "queue", "state", "priority", "seq"),
    sa.Index(None, "username", "seq"),
    sa.Index(None, "array_id", "seq"),
)

transitions = sa.Table(
    "transitions",
    metadata,
    sa.Column("id", AutoId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("target", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Index(None, "job_id", "id"),
)

notices = sa.Table(
    "notices",
    metadata,
    sa.Column("id", AutoId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("message", sa.Text(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Index(None, "job_id", "id"),
)

requests = sa.Table(
    "requests",
    metadata,
    sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Column("value", sa.Float(), nullable=True),  # a number the kind carries (checkpoint: its duration)
)

queues = sa.Table(
    "queues",
    metadata,
    sa.Column("name", sa.String(), primary_key=True),
    sa.Column("spec", sa.JSON(), nullable=False),
)

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("name", sa.String(), primary_key=True),
    sa.Column("spec", sa.JSON(), nullable=False),  # the whole Node, cordoned and healthy included
)

windows = sa.Table(
    "windows",
    metadata,
    sa.Column("name", sa.String(), primary_key=True),
    sa.Column("spec", sa.JSON(), nullable=False),  # the whole Window (`domain/windows.py`)
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("queue", sa.String(), nullable=True),
    sa.Column("secret_hash", sa.String(), nullable=False, unique=True),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("revoked", sa.Boolean(), nullable=False),
)

settings = sa.Table(
    "settings",
    metadata,
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
)

# Admin actions (tokens, queues, nodes, force-cancels, backups, store resets): who, what, when, from where.
# Rows are only ever added.
audit = sa.Table(
    "audit",
    metadata,
    sa.Column("id", AutoId, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Column("actor", sa.String(), nullable=False),  # the token's name, or `local:<OS user>` for local commands
    sa.Column("token_id", sa.String(), nullable=True),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("target", sa.Text(), nullable=False),
    sa.Column("detail", sa.Text(), nullable=False),
    sa.Column("source", sa.String(), nullable=False),  # the client's address, or `local`
    sa.Column("outcome", sa.String(16), nullable=False),  # ok, or denied (a token that may not do it)
    sa.Index(None, "at"),
)

# Idempotency keys of submits, per token: the same key again returns the job it created. Kept for a bounded
# time (`created_at`); the body's hash tells a retry from a different request under the same key.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("token_id", sa.String(), primary_key=True),
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("body_hash", sa.String(64), nullable=False),
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), nullable=False),
    # No index on created_at: a submit looks keys up by (token, key); the clean-up every 10 minutes scans.
    sa.Column("created_at", sa.Float(), nullable=False),
    # On SQLite the rows live in the primary key's b-tree itself: one b-tree written per key, not two.
    sqlite_with_rowid=False,
)

# Cost control. `prices`: USD per GPU-hour per GPU model (`model`: as `model_key` compares it; `shown_model`: as
# the admin wrote it) and pool. `charges`: what each attempt of a job held per model and pool, priced when it
# started (written with the job's move into `admitted`). `budgets`: a queue's cap and action, and the level it
# was last found at (ok, notice, exceeded), which says whether its queue is deprioritised.
prices = sa.Table(
    "prices",
    metadata,
    sa.Column("model", sa.String(), primary_key=True),
    sa.Column("pool", sa.String(16), primary_key=True),
    sa.Column("shown_model", sa.String(), nullable=False),
    sa.Column("usd_per_gpu_hour", sa.Float(), nullable=False),
    sa.Column("source", sa.Text(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
)

charges = sa.Table(
    "charges",
    metadata,
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("started_at", sa.Float(), primary_key=True),  # when the attempt began holding (its transition)
    sa.Column("model", sa.String(), primary_key=True),
    sa.Column("pool", sa.String(16), primary_key=True),
    sa.Column("gpus", sa.Float(), nullable=False),
    sa.Column("usd_per_gpu_hour", sa.Float(), nullable=True),  # None: no price for this model and pool
)

budgets = sa.Table(
    "budgets",
    metadata,
    sa.Column("queue", sa.String(), primary_key=True),
    sa.Column("amount", sa.Float(), nullable=False),
    sa.Column("unit", sa.String(16), nullable=False),
    sa.Column("period", sa.String(16), nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("level", sa.String(16), nullable=False, server_default="ok"),
    sa.Column("level_at", sa.Float(), nullable=True),
)

# Counters: `cluster_version` (bumped on any queue or node change), `submit_seq` and `request_seq` (the
# last sequence number handed out to a job or a request).
meta = sa.Table(
    "meta",
    metadata,
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("value", sa.BigInteger(), nullable=False),
)

CLUSTER_VERSION = "cluster_version"
SUBMIT_SEQ = "submit_seq"
REQUEST_SEQ = "request_seq"
COUNTERS = {CLUSTER_VERSION: 1, SUBMIT_SEQ: 0, REQUEST_SEQ: 0}

# What each job reported about itself (`domain/progress.py`): one row per job that ever reported, its bounded
# history as JSON, rewritten by each batch of reports.
job_progress = sa.Table(
    "job_progress",
    metadata,
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.Column("value", sa.Text(), nullable=False),
)

# The work each attempt lost when it ended by preemption, node loss or failure (`domain/checkpoints.py`,
# `AttemptLoss`), written with the transition that ended it; priced at report time from `charges`.
attempt_losses = sa.Table(
    "attempt_losses",
    metadata,
    sa.Column("job_id", sa.String(), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("attempt", sa.Integer(), primary_key=True),
    sa.Column("cause", sa.String(16), nullable=False),
    sa.Column("started_at", sa.Float(), nullable=False),
    sa.Column("ended_at", sa.Float(), nullable=False),
    sa.Column("lost_s", sa.Float(), nullable=False),
    sa.Column("gpus", sa.Float(), nullable=False),
    sa.Index(None, "ended_at"),
)
