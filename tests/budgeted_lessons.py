"""A run of two rooms whose lessons hold more than its lesson budget, played by a policy that records each prompt's
lesson block per room: what the tests of every prompt the agent is measured or judged with compare with PLAY's.

In each room three lessons are in scope (one for every environment, one for the text family, one for the room
itself: each scope within its own budget), and the budget holds one of them (`BUDGET`, counted as the scripted
policy counts: whitespace words of the block).
"""

from __future__ import annotations

from pathlib import Path

from agent_runtime.config import config_from_dict
from agent_runtime.llm.scripted import ScriptedBackend
from agent_runtime.run.loop import AgentLoop
from agent_runtime.state import Run
from distill.lessons.curate import render_lessons
from distill.lessons.versions import create_version
from memory import ExperienceStore
from tests.continual_envs import LEFT, RIGHT, LeftRoom, RightRoom

ROOMS = {LEFT: LeftRoom, RIGHT: RightRoom}
HEADER = "Lessons from your past experience:"  # where a prompt's lesson block starts
LESSONS = [
    ("Waiting never opens a door.", ["*"]),
    ("Count the doors before you move.", ["family:text"]),
    ("In the red hall the left door is the way out.", [LEFT]),
    ("In the blue cellar the right door is the way out.", [RIGHT]),
]
BUDGET = max(len(render_lessons([text]).split()) for text, _ in LESSONS)  # one lesson, never two

CONFIG = {
    "name": "budgeted",
    "envs": [{"id": LEFT}, {"id": RIGHT}],
    "model": {"name": "tests/scripted", "backend": "scripted"},  # an org/name: the cycle resolves it
    "runtime": {"slots": 2, "episodes": 8},
    "memory": {"embedder": "hash"},
    "evaluation": {"episodes_per_env": 2},
    "lessons": {"budget_tokens": BUDGET, "gate_episodes": 2, "gate_split": "train", "extract_every": 1000},
    "opcd": {"enabled": False, "eval_episodes": 2, "validation_games": 2},
}


class RecordingBackend(ScriptedBackend):
    """The scripted policy, with adapters to act with, that keeps the lesson block of every prompt it is sent, per
    room ("" for a prompt without lessons)."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.adapters: dict[str, str] = {}
        self.active_adapter: str | None = None
        self.blocks: dict[str, set[str]] = {}

    def load_adapter(self, name, path):
        self.adapters[name] = str(path)

    def use_adapter(self, name):
        self.active_adapter = name

    def generate(self, prompts, params):
        for chat in prompts:
            system, user = chat[0]["content"], chat[-1]["content"]
            room = next(env for env, cls in ROOMS.items() if cls.observation in user)
            self.blocks.setdefault(room, set()).add(system[system.index(HEADER) :] if HEADER in system else "")
        return super().generate(prompts, params)


def played_run(workdir: Path, **sections) -> tuple[Run, RecordingBackend, dict[str, set[str]]]:
    """The run with its lessons live, after PLAY's 8 episodes; the policy (its records emptied) and what PLAY's
    prompts held per room. The caller closes `run.store`."""
    config = config_from_dict({**CONFIG, **sections})
    with ExperienceStore.open(workdir, embedder="hash") as store:
        run_id = store.create_run(config.name, config.model_dump(mode="json"))
        ids = [store.add_lesson(text, run_id=run_id, scope=scope, token_count=0) for text, scope in LESSONS]
        create_version(store, run_id, ids)
    backend = RecordingBackend()
    loop = AgentLoop(config, workdir, backend=backend, progress=False)
    try:
        loop.run()
    finally:
        loop.close()
    play, backend.blocks = backend.blocks, {}
    return Run(config, workdir, ExperienceStore.open(workdir, embedder="hash"), run_id), backend, play
