"""Prompt assembly and action parsing."""

from __future__ import annotations

from agent_runtime.episode.prompt import PromptBuilder, Turn, parse_action
from agent_runtime.llm.scripted import ScriptedBackend


def test_text_actions():
    admissible = ["go north", "take coin", "look"]
    assert parse_action("text", "> Take coin.", admissible) == "take coin"
    assert parse_action("text", "\n\nAction: go north\nbecause the exit is there", admissible) == "go north"
    assert parse_action("text", "open the door", admissible) == "open the door"  # not admissible: the game says so
    assert parse_action("text", "   \n ", admissible) is None
    assert parse_action("text", "", None) is None


def test_arena_and_math_actions():
    assert parse_action("arena", "I will go [left] then... no, [down]", None) == "[down]"
    assert parse_action("arena", "move [W]", None) == "[up]"
    assert parse_action("arena", "down", None) is None
    assert parse_action("math", "  so \\boxed{7} ", None) == "so \\boxed{7}"
    assert parse_action("math", "\n", None) is None


def test_prompt_keeps_lessons_and_current_observation_and_drops_oldest_turns():
    backend = ScriptedBackend()
    builder = PromptBuilder(
        family="text",
        count_tokens=backend.count_tokens,
        context_window=120,
        lessons=["explore every exit"],
        reserve_tokens=10,
    )
    history = [Turn(f"room {i} " + "word " * 10, f"go {i}") for i in range(10)]
    chat = builder.build(history, "You see a coin.", ["take coin", "look"])
    assert chat[0]["role"] == "system" and "explore every exit" in chat[0]["content"]
    assert chat[-1]["content"].startswith("You see a coin.") and "take coin | look" in chat[-1]["content"]
    assert backend.count_tokens(chat) + 10 <= 120
    kept = [m["content"] for m in chat if m["role"] == "assistant"]
    assert kept and kept[-1] == "go 9" and "go 0" not in kept  # the newest turns survive


def test_history_limit():
    backend = ScriptedBackend()
    builder = PromptBuilder(
        family="math", count_tokens=backend.count_tokens, context_window=10_000, max_history_turns=2
    )
    chat = builder.build([Turn(str(i), str(i)) for i in range(5)], "now", None)
    assert len(chat) == 1 + 2 * 2 + 1


def test_history_shows_admissible_makes_the_prompt_append_only():
    backend = ScriptedBackend()
    steps = [("You are in a hall.", ["go east", "look"], "go east"), ("You see a coin.", ["take coin"], "take coin")]
    for shows in (False, True):
        builder = PromptBuilder(
            family="text", count_tokens=backend.count_tokens, context_window=10_000, history_shows_admissible=shows
        )
        history: list[Turn] = []
        sent = []
        for observation, admissible, reply in steps:
            sent.append(builder.build(history, observation, admissible))
            history.append(Turn(observation, reply, admissible))
        first, second = sent
        extends = second[: len(first)] == first and second[len(first)] == {"role": "assistant", "content": "go east"}
        assert extends == shows  # as sent, or without the action list
        assert ("go east | look" in second[1]["content"]) == shows
        assert "take coin" in second[-1]["content"]
