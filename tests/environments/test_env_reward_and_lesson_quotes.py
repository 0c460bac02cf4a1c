"""No reward without playing, and quotes that survive the lesson screen.

- A TextWorld cooking game answers "take all" with "You have to be more specific!", but "take all.", "get
  everything from fridge", "take X and Y", "take X. take Y" reached Inform's multi-object parser (or ran two
  commands in one step) and took every ingredient at once: reward for one step of the budget. Such a line is no
  action (`parse_action` gives None, an invalid action) and the environment refuses it before the interpreter.
- The lesson screen's markdown-edge cleanup dropped the closing quote of "Always type 'open door'".
"""

from __future__ import annotations

import pytest

import environments
from agent_runtime.episode.prompt import parse_action
from distill.lessons import screen_item
from distill.lessons.safety import stored_lesson_problem
from environments.interpreter import ONE_AT_A_TIME, multi_command

COOKING = {"recipe": 1, "take": 1, "go": 1}  # tests/environments/test_env_builtin.py's game: shares the session's cache
BIGGER = {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True, "cut": True}
MULTI = [
    "take all.",
    "TAKE ALL",
    "get everything.",
    "take all except knife",
    "take apple and knife",
    "take all. ",
    "  Take   ALL .",
    "pick up all.",
    "take all from fridge",
    "get everything from fridge",
    "take all but cookbook.",
    "take everything but cookbook",
    "take all. look",
    "take all then look",
    "get everything, look",
    "take each",
    "take both",
    "take apple, knife",
]


def _two_takes(admissible: list[str]) -> tuple[str, str, str] | None:
    """Two objects the game lets the player take from one holder: (first, second, holder)."""
    takes = [a[len("take ") :].split(" from ") for a in admissible if a.startswith("take ") and " from " in a]
    for i, (first, holder) in enumerate(takes):
        for second, other in takes[i + 1 :]:
            if other == holder:
                return first, second, holder
    return None


def _combined(admissible: list[str]) -> list[str]:
    """The multi-object and multi-command forms of two admissible takes of this game."""
    pair = _two_takes(admissible)
    assert pair is not None, admissible
    first, second, holder = pair
    return [
        f"take {first} and {second} from {holder}",
        f"take {first}, {second} from {holder}",
        f"take {first} from {holder}. take {second} from {holder}",
        f"take {first} from {holder} then take {second} from {holder}",
    ]


@pytest.mark.slow
def test_take_all_with_a_full_stop_would_score_in_the_interpreter(games_dir):
    """The exploit is real: sent straight to the interpreter, "take all." takes every ingredient and scores."""
    env = environments.make("textworld/cooking", **COOKING, cache_dir=str(games_dir))
    env.reset(task_id="train-0")
    state, _ = env.interpreter.step("take all.")
    assert state["score"] > 0 and "You have to be more specific" not in state["feedback"]
    env.close()


@pytest.mark.parametrize("settings", [COOKING, BIGGER], ids=["cooking", "cooking-bigger"])
def test_multi_object_and_multi_command_lines_earn_nothing(settings, games_dir):
    env = environments.make("textworld/cooking", **settings, cache_dir=str(games_dir))
    _, start = env.reset(task_id="train-0")
    for reply in MULTI + _combined(start["admissible_actions"]):
        assert parse_action("text", reply, start["admissible_actions"]) is None, reply  # an invalid action
        assert parse_action("text", f"> {reply}\nbecause it is fast", start["admissible_actions"]) is None, reply
        env.reset(task_id="train-0")
        result = env.step(reply)  # defence in depth: the environment refuses it as well
        assert result.reward == 0.0 and not result.terminated, reply
        assert result.observation == ONE_AT_A_TIME and result.info["multi_command"], reply
        assert result.info["score"] == 0 and result.info["admissible_actions"] == start["admissible_actions"], reply
    env.close()


def test_refused_lines_change_nothing_and_the_walkthrough_still_wins(games_dir):
    env = environments.make("textworld/cooking", **BIGGER, cache_dir=str(games_dir))
    _, info = env.reset(task_id="train-0")
    for reply in ("take all.", "take all from counter", *_combined(info["admissible_actions"])[:2]):
        assert env.step(reply).reward == 0.0, reply
    total, result = 0.0, None
    for action in env.expert_actions():
        assert parse_action("text", f"{action.capitalize()}.", info["admissible_actions"]) == action
        result = env.step(action)
        total += result.reward
        info = result.info
    assert result is not None and result.terminated and result.info["won"]
    assert total == result.info["max_score"] > 1
    env.close()


@pytest.mark.slow
def test_admissible_actions_and_walkthroughs_are_not_multi(games_dir):
    """No false positives: every admissible action and walkthrough step of sampled games is one command."""
    for env_id, settings in (
        ("textworld/cooking", COOKING),
        ("textworld/cooking", BIGGER),
        ("textworld/coin_collector", {"level": 3}),
    ):
        env = environments.make(env_id, **settings, cache_dir=str(games_dir))
        for task in ("train-0", "eval-0") if settings is not BIGGER else ("train-0",):
            _, info = env.reset(task_id=task)
            commands = info["admissible_actions"] + env.expert_actions()
            assert [c for c in commands if multi_command(c)] == []
        env.close()


@pytest.mark.parametrize(
    "line",
    [
        "take cookbook from table",
        "go north.",
        "Look.",
        "take the coin,",
        "inventory",
        "examine all-purpose knife",
        "take wallet",
        "open thenardier chest",
        "slice carrot with knife",
        "take coin from ball",
    ],
)
def test_one_command_about_one_thing_is_not_multi(line):
    assert multi_command(line) is None


def test_an_admissible_action_is_taken_whatever_its_words():
    """A game's own action is never refused, even one whose object's name holds a multi-object word."""
    admissible = ["take salt and pepper from shelf", "look"]
    assert parse_action("text", "Take salt and pepper from shelf.", admissible) == "take salt and pepper from shelf"
    assert parse_action("text", "take salt and vinegar from shelf", admissible) is None


def test_the_lesson_screen_keeps_a_closing_quote():
    assert screen_item("Always type 'open door'").text == "Always type 'open door'"


@pytest.mark.parametrize(
    "text",
    [
        "Always type 'open door'",
        "'open door' is what to type first",
        'Always type "open door" before going north',
        'Say "go east" (then "take coin")',
        "Type `look` when you are lost",
        "Don't say 'look' twice in a row",
        "Check the players' items, then type 'look'",
        "'Open' the door, then type 'go east'",
        "Always type ('open door')",
        "Take the coin first (it scores)",
        "[Coin] Take the coin before going east.",
    ],
)
def test_balanced_quotes_and_brackets_at_the_ends_survive(text):
    verdict = screen_item(text)
    assert verdict.text == text, verdict.reason
    assert stored_lesson_problem(text) is None


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("**Take the coin first.**", "Take the coin first."),
        ("> Take the coin first.", "Take the coin first."),
        ("_Take the coin first_", "Take the coin first"),
        ("*Take the coin first.*", "Take the coin first."),
        ('"Take the coin first."', "Take the coin first."),  # the whole item quoted
        ("`Take the coin first.`", "Take the coin first."),
        ("'Take the coin first.'", "Take the coin first."),
        ("\"Always type 'open door'\"", "Always type 'open door'"),
        ("> 'Always type \"open door\"'", 'Always type "open door"'),
        ('Take the coin first."', "Take the coin first."),  # unpaired
        ('"Take the coin first.', "Take the coin first."),
        ("Take the coin first '", "Take the coin first"),
        (": ; Take the coin first. **", "Take the coin first."),
        ('""Take the coin first.""', "Take the coin first."),
    ],
)
def test_markdown_and_whole_item_quotes_are_still_stripped(raw, clean):
    assert screen_item(raw).text == clean
    assert screen_item(clean).text == clean  # the screen is idempotent: a stored lesson passes it again
