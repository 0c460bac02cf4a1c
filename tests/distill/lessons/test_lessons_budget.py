"""The lesson budget counts the very block a prompt holds, and one selection fits an episode's lessons to it: all of
them when they fit, else the most relevant that do, in their live order."""

from __future__ import annotations

from pathlib import Path

from agent_runtime.episode.prompt import PromptBuilder
from agent_runtime.episode.runner import Draw
from agent_runtime.phases.lesson_contexts import LessonContexts
from distill.lessons import LessonCurator, render_lessons
from distill.lessons.versions import create_version
from memory import ExperienceStore
from memory.embeddings import HashEmbedder

LESSON = "Take the coin as soon as you see it."


def words(text: str) -> int:
    return len(text.split())


def test_the_budget_counts_the_lesson_block_exactly_as_the_prompt_holds_it() -> None:
    builder = PromptBuilder("text", count_tokens=lambda chat: 0, context_window=4096)
    bare, taught = builder.system_message([]), builder.system_message([LESSON])
    assert taught == bare + "\n\n" + render_lessons([LESSON])


def test_a_lesson_whose_prompt_block_is_one_token_over_the_budget_is_not_shown(tmp_path: Path) -> None:
    """PLAY's budget: the block of the lesson as the system prompt holds it, counted, against `budget_tokens`."""
    builder = PromptBuilder("text", count_tokens=lambda chat: 0, context_window=4096)
    in_prompt = words(builder.system_message([LESSON])) - words(builder.system_message([]))
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(64)) as store:
        run_id = store.create_run("r", {})
        create_version(store, run_id, [store.add_lesson(LESSON, run_id=run_id, token_count=in_prompt)])
        for budget, shown in ((in_prompt, (LESSON,)), (in_prompt - 1, ())):
            contexts = LessonContexts(store, run_id, 1, 0, budget_tokens=budget, count_tokens=words)
            context = contexts.choose(contexts.for_draw(Draw(0, 0, "train-0", 1)), "x/y", "goal", "A hall.")
            assert context.lessons == shown, budget


def test_the_curator_keeps_a_scope_within_the_tokens_its_prompt_block_takes(tmp_path: Path) -> None:
    """A person's lesson whose block in the prompt is one token over the budget is refused; at the budget it is
    kept."""
    from distill.lessons.extractor import Proposal

    builder = PromptBuilder("text", count_tokens=lambda chat: 0, context_window=4096)
    in_prompt = words(builder.system_message([LESSON])) - words(builder.system_message([]))
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(64)) as store:
        run_id = store.create_run("r", {})
        for budget, kept in ((in_prompt, [LESSON]), (in_prompt - 1, [])):
            curator = LessonCurator(store, run_id, count_tokens=words, budget_tokens=budget)
            curator.begin()
            lesson_id = store.add_lesson(LESSON, run_id=run_id, status="proposed", token_count=in_prompt)
            curator.apply([Proposal("add", LESSON, 0, None, (), lesson_id=lesson_id)])
            assert [x.text for x in curator.working(0)] == kept, budget
