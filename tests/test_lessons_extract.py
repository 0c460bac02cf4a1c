"""Lesson extraction: parsing messy extractor output, the prompt, the extractor, and what gets recorded."""

from __future__ import annotations

import pytest

from distill.lessons import (
    LessonExtractor,
    LessonsSettings,
    build_prompt,
    parse_free_text,
    parse_items,
    parse_operation,
    record_extraction,
)
from memory import ExperienceStore
from memory.embeddings import HashEmbedder
from tests.fixtures_memory import make_episode

MESSY = """<think>
Let me think. Maybe - EXPERIENCE ITEM: this is only a thought and must not count.
</think>
Sure! Here is my analysis of the attempt... the agent fell in a hole.

**New experience:**
1. - EXPERIENCE ITEM: Check the whole map before the first move.
2) **- EXPERIENCE ITEM:** Avoid tiles marked H; they end the game. - EXPERIENCE ITEM: Prefer moves that reduce the distance to G.
   * Experience item 3: `Read the feedback` after every move
- EXPERIENCE ITEM: ...
- EXPERIENCE ITEM: <item>
The EXPERIENCE ITEM: format above is what I used.
- EXPERIENCE ITEM: [#12] check the whole map before the first move
Random junk ### ~~~ 12345
"""


def test_parse_items_tolerates_thinking_markdown_numbering_and_junk() -> None:
    assert parse_items(MESSY) == [
        "Check the whole map before the first move.",
        "Avoid tiles marked H; they end the game.",
        "Prefer moves that reduce the distance to G.",
        "Read the feedback after every move",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I could not find any lesson here.",
        "<think>- EXPERIENCE ITEM: unfinished thought that never closes",
        "- EXPERIENCE ITEM: ...\n- EXPERIENCE ITEM:\n- EXPERIENCE ITEM: NONE",
    ],
)
def test_nothing_parseable_gives_no_items(text: str) -> None:
    assert parse_items(text) == []


def test_unopened_think_block_is_dropped() -> None:
    # Some chat templates open <think> in the prompt, so the answer only closes it.
    text = "- EXPERIENCE ITEM: thinking out loud</think>\n- EXPERIENCE ITEM: The real item."
    assert parse_items(text) == ["The real item."]


def test_free_text_style_takes_bullets_or_paragraphs() -> None:
    assert parse_free_text("reasoning...\nNew experience:\n- Go right first.\n- Avoid holes.") == [
        "Go right first.",
        "Avoid holes.",
    ]
    assert parse_free_text("<think>x</think>Moving down first works.\n\nHoles end the game.") == [
        "Moving down first works.",
        "Holes end the game.",
    ]


def test_parse_operation_reads_update_and_delete() -> None:
    assert parse_operation("UPDATE #12: Never step on H.").op == "update"
    assert parse_operation("UPDATE #12: Never step on H.").target == 12
    assert parse_operation("delete [#3]").op == "delete"
    assert parse_operation("update the map after each move").op == "add"
    assert parse_operation("Remove 3 boxes from corners first.").op == "add"  # ids need a '#'
    assert parse_operation("UPDATE #4").op == "add"  # no replacement text: not a usable correction


@pytest.fixture
def store(tmp_path):
    opened = ExperienceStore.open(tmp_path / "work", embedder=HashEmbedder(dim=64))
    yield opened
    opened.close()


@pytest.fixture
def episode(store):
    run_id = store.create_run("t", {})
    record = make_episode(3, outcome="lost", goal="reach the gift")
    record.metadata["final_observation"] = "You fell into a hole. Game over."
    return run_id, store.episode(store.add_episode(run_id, record))


def test_prompt_shows_trajectory_outcome_feedback_and_current_lessons(store, episode) -> None:
    _, ep = episode
    lesson_id = store.add_lesson("Look before you leap.")
    current = [store.get_lesson(lesson_id)]
    text = build_prompt(ep, current, max_items=2)[0]["content"]
    assert "Task: reach the gift" in text
    assert "You are in room 2 of task-0" in text and "Turn 3" in text
    assert "LOST" in text and "You fell into a hole" in text
    assert f"[#{lesson_id}] Look before you leap." in text
    assert "- EXPERIENCE ITEM:" in text and "at most 2" in text
    free = build_prompt(ep, [], style="free")[0]["content"]
    assert "No experience yet." in free and "UPDATE #" not in free
    with pytest.raises(ValueError, match="known: structured, free"):
        build_prompt(ep, [], style="poem")  # type: ignore[arg-type]


def test_long_trajectory_is_elided_in_the_middle(store) -> None:
    run_id = store.create_run("t", {})
    ep = store.episode(store.add_episode(run_id, make_episode(40)))
    text = build_prompt(ep, [], max_trajectory_chars=2500)[0]["content"]
    assert "Turn 1\n" in text and "Turn 40\n" in text and "turn(s) omitted" in text
    assert len(text) < 2500 + 2000  # the trajectory cap plus the fixed instructions


def test_extractor_batches_keeps_max_items_and_records_empty(store, episode) -> None:
    run_id, ep = episode
    seen: list[int] = []

    def complete(chats):
        seen.append(len(chats))
        return [MESSY, "no idea, sorry"]

    extractor = LessonExtractor.from_settings(complete, LessonsSettings(max_items=2))
    full, empty = extractor.extract([ep, ep], [])
    assert seen == [2]
    assert full.items == [
        "Check the whole map before the first move.",
        "Avoid tiles marked H; they end the game.",
    ]
    assert [r.reason for r in full.rejected] == ["over max_items=2", "over max_items=2"]
    assert empty.empty and empty.raw == "no idea, sorry"

    recorded = record_extraction(store, full, run_id=run_id, count_tokens=lambda s: len(s.split()))
    lessons = store.lessons(run_id)
    assert [x.text for x in lessons] == full.items
    for lesson in lessons:
        assert lesson.status == "proposed"
        assert lesson.source_episode_ids == [ep.id]
        assert lesson.extraction_id == recorded.extraction_id
        assert lesson.token_count == len(lesson.text.split())
    blank = record_extraction(store, empty, run_id=run_id)
    info = store.get_extraction(blank.extraction_id)
    assert blank.proposals == [] and info.metadata["empty"] is True
    assert info.response == "no idea, sorry" and info.episode_ids == [ep.id]


def test_recorded_update_and_delete_keep_their_targets(store, episode) -> None:
    run_id, ep = episode
    answer = "- EXPERIENCE ITEM: UPDATE #7: Never step on H.\n- EXPERIENCE ITEM: DELETE #9"
    outcome = LessonExtractor(lambda chats: [answer] * len(chats)).extract([ep])[0]
    recorded = record_extraction(store, outcome, run_id=run_id)
    update, delete = recorded.proposals
    assert (update.op, update.target, update.text) == ("update", 7, "Never step on H.")
    assert store.get_lesson(update.lesson_id).metadata == {"op": "update", "target": 7}
    assert (delete.op, delete.target, delete.lesson_id) == ("delete", 9, None)
    assert store.get_extraction(recorded.extraction_id).metadata["deletes"] == [9]


def test_extractor_refuses_episode_without_steps(store, episode) -> None:
    run_id, _ = episode
    listed = store.episodes(run_id)[0]  # lists leave steps empty
    with pytest.raises(ValueError, match="ExperienceStore.episode"):
        LessonExtractor(lambda chats: [""] * len(chats)).extract([listed])


def test_long_responses_keep_their_head_and_tail(store) -> None:
    run_id = store.create_run("t", {})
    record = make_episode(1)
    record.steps[0].response = "Let me solve it. " + "blah " * 400 + "The answer is 42."
    ep = store.episode(store.add_episode(run_id, record))
    text = build_prompt(ep, [], max_step_chars=300)[0]["content"]
    assert "Let me solve it." in text and "The answer is 42." in text and " ... " in text
