"""Bounded storage: prompts as recipes, lesson provenance and cycle curves as rows, training sets recorded.

Until this revision every step stored its whole prompt (the system part and the whole history again at
every turn). Upgrading converts each step, in place, to the recipe `memory.prompts` describes: the text
only it has, plus a reference to the earlier step of its episode whose prompt it extends (`prompt_base`,
`prompt_keep`, `prompt_resume`), or for an episode's first step a content-addressed `prompt_parts` row (the
system part, shared by every episode with the same lessons), with the observation left out where the
prompt shows it (`prompt_observation_at`). Reads rebuild the exact text. The encoding rules are copied
here on purpose, as 0002's are: a migration keeps meaning what it meant when it was written.

Also: `lesson_sources` (each lesson's `source_episode_ids` as indexed rows), `cycle_points` (a cycle's
curves, one row per step, appended), `opcd_cycles.episode_ids` (the episodes an OPCD cycle's prompts came
from: an adapter's training set, which `memory prune` keeps; [] for older cycles), and an index on
episodes (run_id, ended_at). Columns are added in place (`ADD COLUMN`), never by recreating a table.

The conversion reads and rewrites every step, an episode batch at a time, with a progress bar on
stderr for a database of more than a few thousand steps; it runs in the migration's one transaction,
so a process killed half way leaves the database at 0002, whole. SQLite keeps the file's size until
`agent-runtime memory vacuum` returns the freed pages.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 02:00:00
"""

import hashlib
import json
import sys
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
EPISODE_BATCH = 500
PROGRESS_ABOVE = 5000  # steps

STEPS = sa.table(
    "steps",
    sa.column("id", sa.Integer),
    sa.column("episode_id", sa.Integer),
    sa.column("step_index", sa.Integer),
    sa.column("observation", sa.Text),
    sa.column("prompt", sa.Text),
    sa.column("prompt_part_id", sa.Integer),
    sa.column("prompt_base", sa.Integer),
    sa.column("prompt_keep", sa.Integer),
    sa.column("prompt_resume", sa.Integer),
    sa.column("prompt_observation_at", sa.Integer),
)
PARTS = sa.table(
    "prompt_parts", sa.column("id", sa.Integer), sa.column("digest", sa.String), sa.column("text", sa.Text)
)
LESSONS = sa.table("lessons", sa.column("id", sa.Integer), sa.column("source_episode_ids", JSON))
SOURCES = sa.table("lesson_sources", sa.column("lesson_id", sa.Integer), sa.column("episode_id", sa.Integer))

# -- the encoding rules of this revision (memory/prompts.py at the time) -------------------------------
MIN_PART, MIN_TAIL, PROBE, MAX_PROBES, MIN_OBSERVATION = 32, 32, 48, 32, 8


def _common_prefix(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _tail_start(base: str, prompt: str, keep: int) -> int | None:
    probe = prompt[keep : keep + PROBE]
    if len(probe) < MIN_TAIL:
        return None
    position = base.find(probe, keep)
    for _ in range(MAX_PROBES):
        if position < 0 or len(base) - position < MIN_TAIL:
            return None
        if prompt.startswith(base[position:], keep):
            return position
        position = base.find(probe, position + 1)
    return None


def encode(previous: tuple[int, str] | None, index: int, observation: str, prompt: str) -> dict:
    """The recipe of one step (`part` is the part's text), given its episode's previous step."""
    recipe = {"own": prompt, "part": None, "base": None, "keep": None, "resume": None, "at": None}
    if previous is not None and previous[0] < index:
        base_index, base = previous
        keep = _common_prefix(base, prompt)
        resume = _tail_start(base, prompt, keep) if keep < len(base) else None
        reused = keep + (len(base) - resume if resume is not None else 0)
        if reused >= MIN_PART:
            recipe.update(own=prompt[reused:], base=base_index, keep=keep, resume=resume)
    shown = observation.strip()
    if recipe["base"] is None:
        cut = prompt.rfind(shown) if len(shown) >= MIN_OBSERVATION else -1
        if cut >= MIN_PART:
            recipe.update(own=prompt[cut:], part=prompt[:cut])
    if len(shown) >= MIN_OBSERVATION:
        at = recipe["own"].rfind(shown)
        if at >= 0:
            recipe.update(own=recipe["own"][:at] + recipe["own"][at + len(shown) :], at=at)
    return recipe


# -- the schema --------------------------------------------------------------------------------------


def upgrade() -> None:
    op.create_table(
        "prompt_parts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prompt_parts")),
        sa.UniqueConstraint("digest", name=op.f("uq_prompt_parts_digest")),
    )
    fk = "fk_steps_prompt_part_id_prompt_parts"
    if op.get_bind().dialect.name == "sqlite":  # in place: SQLite adds a column with REFERENCES (NULL default)
        op.execute(f"ALTER TABLE steps ADD COLUMN prompt_part_id INTEGER CONSTRAINT {fk} REFERENCES prompt_parts (id)")
    else:
        op.add_column("steps", sa.Column("prompt_part_id", sa.Integer(), nullable=True))
        op.create_foreign_key(op.f(fk), "steps", "prompt_parts", ["prompt_part_id"], ["id"])
    for name in ("prompt_base", "prompt_keep", "prompt_resume", "prompt_observation_at"):
        op.add_column("steps", sa.Column(name, sa.Integer(), nullable=True))
    used = sa.text("prompt_part_id IS NOT NULL")  # only first steps have a part: a partial index stays small
    op.create_index(
        "ix_steps_prompt_part_id", "steps", ["prompt_part_id"], unique=False, sqlite_where=used, postgresql_where=used
    )
    op.add_column("opcd_cycles", sa.Column("episode_ids", JSON, nullable=False, server_default=sa.text("'[]'")))
    op.create_table(
        "cycle_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["cycle_id"], ["opcd_cycles.id"], name=op.f("fk_cycle_points_cycle_id_opcd_cycles"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cycle_points")),
        sa.UniqueConstraint("cycle_id", "step", name="uq_cycle_points_cycle_step"),
    )
    op.create_table(
        "lesson_sources",
        sa.Column("lesson_id", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["lesson_id"], ["lessons.id"], name=op.f("fk_lesson_sources_lesson_id_lessons"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("lesson_id", "episode_id", name=op.f("pk_lesson_sources")),
    )
    op.create_index(op.f("ix_lesson_sources_episode_id"), "lesson_sources", ["episode_id"], unique=False)
    op.create_index("ix_episodes_run_id_ended_at", "episodes", ["run_id", "ended_at"], unique=False)
    bind = op.get_bind()
    _fill_lesson_sources(bind)
    _convert_steps(bind)


def _fill_lesson_sources(bind: sa.Connection) -> None:
    rows = []
    for lesson_id, sources in bind.execute(sa.select(LESSONS.c.id, LESSONS.c.source_episode_ids)):
        if isinstance(sources, str):
            sources = json.loads(sources)
        ids = {e for e in sources or [] if isinstance(e, int) and not isinstance(e, bool)}
        rows += [{"lesson_id": lesson_id, "episode_id": e} for e in sorted(ids)]
    if rows:
        bind.execute(SOURCES.insert(), rows)


def _part_id(bind: sa.Connection, text: str, known: dict[str, int]) -> int:
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if key not in known:
        found = bind.execute(sa.select(PARTS.c.id).where(PARTS.c.digest == key)).scalar()
        if found is None:
            found = bind.execute(PARTS.insert().values(digest=key, text=text).returning(PARTS.c.id)).scalar_one()
        known[key] = found
    return known[key]


def _convert_steps(bind: sa.Connection) -> None:
    total = bind.execute(sa.select(sa.func.count()).select_from(STEPS)).scalar_one()
    bar = None
    if total > PROGRESS_ABOVE:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="migrating prompts (0003)", unit="step", file=sys.stderr)
    parts: dict[str, int] = {}
    after = 0
    while True:
        episode_ids = (
            bind.execute(
                sa.select(STEPS.c.episode_id)
                .where(STEPS.c.episode_id > after)
                .distinct()
                .order_by(STEPS.c.episode_id)
                .limit(EPISODE_BATCH)
            )
            .scalars()
            .all()
        )
        if not episode_ids:
            break
        rows = bind.execute(
            sa.select(STEPS.c.id, STEPS.c.episode_id, STEPS.c.step_index, STEPS.c.observation, STEPS.c.prompt)
            .where(STEPS.c.episode_id.in_(episode_ids))
            .order_by(STEPS.c.episode_id, STEPS.c.step_index)
        ).all()
        changes, previous = [], {}
        for step_id, episode_id, index, observation, prompt in rows:
            recipe = encode(previous.get(episode_id), index, observation, prompt)
            previous[episode_id] = (index, prompt)
            part = _part_id(bind, recipe["part"], parts) if recipe["part"] is not None else None
            changes.append(
                {
                    "row_id": step_id,
                    "new_prompt": recipe["own"],
                    "new_part": part,
                    "new_base": recipe["base"],
                    "new_keep": recipe["keep"],
                    "new_resume": recipe["resume"],
                    "new_at": recipe["at"],
                }
            )
        bind.execute(
            STEPS.update()
            .where(STEPS.c.id == sa.bindparam("row_id"))
            .values(
                prompt=sa.bindparam("new_prompt"),
                prompt_part_id=sa.bindparam("new_part"),
                prompt_base=sa.bindparam("new_base"),
                prompt_keep=sa.bindparam("new_keep"),
                prompt_resume=sa.bindparam("new_resume"),
                prompt_observation_at=sa.bindparam("new_at"),
            ),
            changes,
        )
        if bar is not None:
            bar.update(len(rows))
        after = episode_ids[-1]
    if bar is not None:
        bar.close()


def downgrade() -> None:
    """Back to whole prompts (rebuilt from the recipes), then the columns and tables go."""
    bind = op.get_bind()
    parts = dict(bind.execute(sa.select(PARTS.c.id, PARTS.c.text)).all())
    after = 0
    while True:
        episode_ids = (
            bind.execute(
                sa.select(STEPS.c.episode_id)
                .where(STEPS.c.episode_id > after)
                .distinct()
                .order_by(STEPS.c.episode_id)
                .limit(EPISODE_BATCH)
            )
            .scalars()
            .all()
        )
        if not episode_ids:
            break
        rows = (
            bind.execute(
                sa.select(STEPS)
                .where(STEPS.c.episode_id.in_(episode_ids))
                .order_by(STEPS.c.episode_id, STEPS.c.step_index)
            )
            .mappings()
            .all()
        )
        full: dict[tuple[int, int], str] = {}
        changes = []
        for row in rows:
            own = row["prompt"]
            if row["prompt_observation_at"] is not None:
                at = row["prompt_observation_at"]
                own = own[:at] + row["observation"].strip() + own[at:]
            head = parts[row["prompt_part_id"]] if row["prompt_part_id"] is not None else ""
            if row["prompt_base"] is not None:
                base = full[(row["episode_id"], row["prompt_base"])]
                head += base[: row["prompt_keep"]] + (
                    base[row["prompt_resume"] :] if row["prompt_resume"] is not None else ""
                )
            full[(row["episode_id"], row["step_index"])] = head + own
            changes.append({"row_id": row["id"], "new_prompt": head + own})
        bind.execute(
            STEPS.update().where(STEPS.c.id == sa.bindparam("row_id")).values(prompt=sa.bindparam("new_prompt")),
            changes,
        )
        after = episode_ids[-1]
    op.drop_index("ix_episodes_run_id_ended_at", table_name="episodes")
    op.drop_index(op.f("ix_lesson_sources_episode_id"), table_name="lesson_sources")
    op.drop_table("lesson_sources")
    op.drop_table("cycle_points")
    op.drop_column("opcd_cycles", "episode_ids")
    op.drop_index("ix_steps_prompt_part_id", table_name="steps")
    names = ("prompt_observation_at", "prompt_resume", "prompt_keep", "prompt_base", "prompt_part_id")
    if bind.dialect.name == "sqlite":  # SQLite drops no column that references a table: copy `steps` once
        with op.batch_alter_table("steps", recreate="always") as batch:
            for name in names:
                batch.drop_column(name)
    else:
        op.drop_constraint(op.f("fk_steps_prompt_part_id_prompt_parts"), "steps", type_="foreignkey")
        for name in names:
            op.drop_column("steps", name)
    op.drop_table("prompt_parts")
