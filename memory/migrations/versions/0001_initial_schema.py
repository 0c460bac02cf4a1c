"""Initial schema: runs, episodes, steps, lessons, lesson sets, extractions, OPCD cycles, adapters,
evaluations and embeddings (see memory/models.py for what each holds).

Revision ID: 0001
Revises:
Create Date: 2026-11-29 19:20:45.604808
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# JSONB on PostgreSQL (indexable, compact), JSON text elsewhere.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "embeddings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('episode', 'lesson')", name=op.f("ck_embeddings_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embeddings")),
        sa.UniqueConstraint("kind", "model", "item_id", name="uq_embeddings_kind_model_item"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("phase", sa.String(length=40), nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("status", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_name"), ["name"], unique=False)

    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("base_model", sa.String(length=300), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.CheckConstraint("status IN ('candidate', 'active', 'rejected', 'retired')", name=op.f("ck_adapters_status")),
        sa.ForeignKeyConstraint(["parent_id"], ["adapters.id"], name=op.f("fk_adapters_parent_id_adapters")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_adapters_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_run_id"), ["run_id"], unique=False)

    op.create_table(
        "extractions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("extractor", sa.String(length=300), nullable=False),
        sa.Column("episode_ids", JSON, nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_extractions_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_extractions")),
    )
    with op.batch_alter_table("extractions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_extractions_run_id"), ["run_id"], unique=False)

    op.create_table(
        "lesson_sets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_lesson_sets_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lesson_sets")),
        sa.UniqueConstraint("run_id", "version", name="uq_lesson_sets_run_version"),
    )
    op.create_table(
        "episodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("env_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=500), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("policy", sa.String(length=300), nullable=False),
        sa.Column("adapter_id", sa.Integer(), nullable=True),
        sa.Column("lesson_set_version", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("won", sa.Boolean(), nullable=False),
        sa.Column("total_return", sa.Float(), nullable=False),
        sa.Column("num_steps", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("goal", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("lessons_in_context", JSON, nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.CheckConstraint("outcome IN ('won', 'lost', 'truncated', 'error')", name=op.f("ck_episodes_outcome")),
        sa.ForeignKeyConstraint(["adapter_id"], ["adapters.id"], name=op.f("fk_episodes_adapter_id_adapters")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_episodes_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
    )
    with op.batch_alter_table("episodes", schema=None) as batch_op:
        batch_op.create_index("ix_episodes_env_id_outcome", ["env_id", "outcome"], unique=False)
        batch_op.create_index("ix_episodes_run_id_id", ["run_id", "id"], unique=False)

    op.create_table(
        "opcd_cycles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("lesson_set_version", sa.Integer(), nullable=True),
        sa.Column("base_adapter_id", sa.Integer(), nullable=True),
        sa.Column("adapter_id", sa.Integer(), nullable=True),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("curves", JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed', 'promoted', 'rolled_back')",
            name=op.f("ck_opcd_cycles_status"),
        ),
        sa.ForeignKeyConstraint(["adapter_id"], ["adapters.id"], name=op.f("fk_opcd_cycles_adapter_id_adapters")),
        sa.ForeignKeyConstraint(
            ["base_adapter_id"], ["adapters.id"], name=op.f("fk_opcd_cycles_base_adapter_id_adapters")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_opcd_cycles_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_opcd_cycles")),
    )
    with op.batch_alter_table("opcd_cycles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_opcd_cycles_run_id"), ["run_id"], unique=False)

    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("adapter_id", sa.Integer(), nullable=True),
        sa.Column("cycle_id", sa.Integer(), nullable=True),
        sa.Column("lesson_set_version", sa.Integer(), nullable=True),
        sa.Column("env_id", sa.String(length=200), nullable=False),
        sa.Column("split", sa.String(length=40), nullable=False),
        sa.Column("policy", sa.String(length=300), nullable=False),
        sa.Column("num_episodes", sa.Integer(), nullable=False),
        sa.Column("success_rate", sa.Float(), nullable=True),
        sa.Column("mean_return", sa.Float(), nullable=True),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["adapter_id"], ["adapters.id"], name=op.f("fk_evaluations_adapter_id_adapters")),
        sa.ForeignKeyConstraint(["cycle_id"], ["opcd_cycles.id"], name=op.f("fk_evaluations_cycle_id_opcd_cycles")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_evaluations_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
    )
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evaluations_adapter_id"), ["adapter_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_evaluations_cycle_id"), ["cycle_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_evaluations_run_id"), ["run_id"], unique=False)

    op.create_table(
        "lessons",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("pool", sa.Integer(), nullable=False),
        sa.Column("env_id", sa.String(length=200), nullable=True),
        sa.Column("source_episode_ids", JSON, nullable=False),
        sa.Column("extraction_id", sa.Integer(), nullable=True),
        sa.Column("consolidated_cycle_id", sa.Integer(), nullable=True),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("times_in_context", sa.Integer(), nullable=False),
        sa.Column("wins_in_context", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.CheckConstraint(
            "status IN ('proposed', 'active', 'consolidated', 'retired')", name=op.f("ck_lessons_status")
        ),
        sa.ForeignKeyConstraint(
            ["consolidated_cycle_id"], ["opcd_cycles.id"], name=op.f("fk_lessons_consolidated_cycle_id_opcd_cycles")
        ),
        sa.ForeignKeyConstraint(
            ["extraction_id"], ["extractions.id"], name=op.f("fk_lessons_extraction_id_extractions")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_lessons_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lessons")),
    )
    with op.batch_alter_table("lessons", schema=None) as batch_op:
        batch_op.create_index("ix_lessons_run_id_status", ["run_id", "status"], unique=False)

    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("observation", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=True),
        sa.Column("valid_action", sa.Boolean(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("admissible_actions", JSON, nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("info", JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["episode_id"], ["episodes.id"], name=op.f("fk_steps_episode_id_episodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint("episode_id", "step_index", name="uq_steps_episode_index"),
    )
    op.create_table(
        "lesson_set_members",
        sa.Column("lesson_set_id", sa.Integer(), nullable=False),
        sa.Column("lesson_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["lesson_id"], ["lessons.id"], name=op.f("fk_lesson_set_members_lesson_id_lessons")),
        sa.ForeignKeyConstraint(
            ["lesson_set_id"],
            ["lesson_sets.id"],
            name=op.f("fk_lesson_set_members_lesson_set_id_lesson_sets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("lesson_set_id", "lesson_id", name=op.f("pk_lesson_set_members")),
    )
    with op.batch_alter_table("lesson_set_members", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lesson_set_members_lesson_id"), ["lesson_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("lesson_set_members", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lesson_set_members_lesson_id"))

    op.drop_table("lesson_set_members")
    op.drop_table("steps")
    with op.batch_alter_table("lessons", schema=None) as batch_op:
        batch_op.drop_index("ix_lessons_run_id_status")

    op.drop_table("lessons")
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evaluations_run_id"))
        batch_op.drop_index(batch_op.f("ix_evaluations_cycle_id"))
        batch_op.drop_index(batch_op.f("ix_evaluations_adapter_id"))

    op.drop_table("evaluations")
    with op.batch_alter_table("opcd_cycles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_opcd_cycles_run_id"))

    op.drop_table("opcd_cycles")
    with op.batch_alter_table("episodes", schema=None) as batch_op:
        batch_op.drop_index("ix_episodes_run_id_id")
        batch_op.drop_index("ix_episodes_env_id_outcome")

    op.drop_table("episodes")
    op.drop_table("lesson_sets")
    with op.batch_alter_table("extractions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_extractions_run_id"))

    op.drop_table("extractions")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapters_run_id"))

    op.drop_table("adapters")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_name"))

    op.drop_table("runs")
    op.drop_table("embeddings")
