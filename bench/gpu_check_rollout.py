"""The rollout rows of `bench/gpu_check.sh`, shared by its transformers section (`bench/gpu_check.py rollout`) and its
vllm section (`bench/gpu_check_vllm.py`): the game (TextWorld coin_collector when textworld is installed, else a
synthetic stand-in) and one measured row, episodes on slots through the runtime's own runner.
"""

from __future__ import annotations

import importlib.util
import time

from bench.gpu_check_models import peak, sync

ROOM_TEXT = (
    "-= {room} =-\nYou arrive in a {room}. A plain, dusty place. There is an exit to the {exit}. "
    "You notice a wooden table, a rusty lamp and a closed chest here. Nothing else catches your eye."
)


class SyntheticTextEnv:
    """Stands in for TextWorld when it is not installed: room descriptions, admissible actions, never won."""

    def __init__(self, max_steps: int):
        self.max_steps, self.steps, self.rooms = max_steps, 0, ["kitchen", "cellar", "attic", "garden", "hall"]

    def _observation(self) -> tuple[str, dict]:
        room = self.rooms[self.steps % len(self.rooms)]
        exit_ = ["north", "south", "east", "west"][self.steps % 4]
        info = {
            "admissible_actions": [f"go {exit_}", "look", "inventory", "open chest", "take lamp"],
            "won": False,
            "goal": "Find the coin and take it.",
        }
        return ROOM_TEXT.format(room=room, exit=exit_), info

    def reset(self, *, seed=None, task_id=None):
        self.steps = 0
        return self._observation()

    def step(self, action: str):
        self.steps += 1
        observation, info = self._observation()
        return observation, 0.0, False, self.steps >= self.max_steps, info

    def close(self) -> None:
        pass


def game_factory(args, max_steps: int):
    """(factory, description): TextWorld coin_collector level 1 when textworld is installed, else synthetic."""
    if importlib.util.find_spec("textworld") is not None and not args.synthetic:
        import tempfile

        import environments

        cache = tempfile.mkdtemp(prefix="gpu-check-games-")
        kwargs = {"level": 1, "n_train": 4, "cache_dir": cache, "max_steps": max_steps}
        probe = environments.make("textworld/coin_collector", **kwargs)
        for task in probe.tasks("train"):
            probe.game_file(task)  # generate before timing
        probe.close()
        return (
            lambda: environments.make("textworld/coin_collector", **kwargs)
        ), "TextWorld coin_collector level 1 (4 games)"
    reason = "--synthetic" if args.synthetic else "textworld not installed"
    return (lambda: SyntheticTextEnv(max_steps)), f"synthetic text env ({reason})"


def rollout_row(
    args,
    out,
    backend,
    builder,
    params,
    factory,
    env_label,
    EpisodeRunner,
    slots,
    episodes,
    max_steps,
    new_tokens,
    device,
    *,
    label: str = "rollout",
    memory: str | None = None,
) -> None:
    """One row of the rollout section: `episodes` episodes on `slots` slots through the runtime's runner."""
    calls, gen_seconds, tokens = backend.stats.calls, backend.stats.seconds, backend.stats.completion_tokens
    start = time.perf_counter()
    if EpisodeRunner is not None:
        from agent_runtime.episode.runner import EnvSlotSpec, TaskSampler

        finished = []
        spec = EnvSlotSpec("textworld/coin_collector", factory, "text", max_steps)
        runner = EpisodeRunner(backend, [spec], [builder], params, slots=slots)
        sampler = TaskSampler([1.0], [[f"train-{i}" for i in range(4)]], seed=0)
        draws = iter([sampler.draw(i) for i in range(episodes)])
        runner.run(lambda draws=draws: next(draws, None), finished.append)
        runner.close()
        errors = [e.error for e in finished if e.outcome == "error"]
        if errors:
            raise RuntimeError(f"{len(errors)} episodes errored, first: {errors[0]}")
        steps = sum(len(e.steps) for e in finished)
    else:
        steps = _batched_turns(backend, builder, params, factory, slots, episodes, max_steps)
    sync(device)
    wall = time.perf_counter() - start
    share = (backend.stats.seconds - gen_seconds) / wall
    tps = (backend.stats.completion_tokens - tokens) / wall
    from agent_runtime.llm.transformers_backend import TransformersBackend

    # the transformers backend's own prefix cache may be off; a vLLM engine here runs with its prefix caching on
    on = backend.prefix_cache if isinstance(backend, TransformersBackend) else True
    cache = "prefix cache on" if on else "prefix cache off"
    out.add(
        f"{label}, {slots} slots",
        f"{60 * episodes / wall:,.1f} episodes/min, {tps:,.0f} gen tokens/s",
        f"{episodes} episodes x {max_steps} steps ({steps} steps), {new_tokens} new tokens, "
        f"{backend.stats.calls - calls} generate calls, {share:.0%} of wall in generate, {cache}, "
        f"{env_label}, {memory or peak(device)}",
        tokens_per_s=tps,
        slots=slots,
    )


def _batched_turns(backend, builder, params, factory, slots: int, episodes: int, max_steps: int) -> int:
    """The runner's turn loop without the runner: `slots` episodes at a time, one generate per turn."""
    from agent_runtime.episode.prompt import Turn

    steps = 0
    for first in range(0, episodes, slots):
        envs = [factory() for _ in range(min(slots, episodes - first))]
        states = [list(env.reset(task_id="train-0")) + [[]] for env in envs]
        for _ in range(max_steps):
            chats = [builder.build(history, obs, info.get("admissible_actions")) for obs, info, history in states]
            for env, state, completion in zip(envs, states, backend.generate(chats, params)):
                observation, _, _, _, info = env.step(completion.text or "look")
                state[2].append(Turn(state[0], completion.text))
                state[0], state[1] = observation, info
                steps += 1
        for env in envs:
            env.close()
    return steps
