"""Text environments for the agent: the contract, the registry and plugins, and the conformance checker.

    import environments
    env = environments.make("textworld/coin_collector", cache_dir="runs/x/games")
    observation, info = env.reset(task_id=env.tasks("train")[0])
    result = env.step(info["admissible_actions"][0])

Importing this package is cheap: game libraries load only when an environment is made.
"""

from environments.base import (
    EnvError,
    EnvSpec,
    MissingSplitError,
    ResetNeededError,
    StepResult,
    TextEnv,
    UnknownEnvironmentError,
)
from environments.checker import EnvCheckError, check_env, cli_check
from environments.episodic import UnknownTaskError
from environments.registry import (
    DuplicateEnvironmentError,
    EnvConstructionError,
    EnvRecord,
    list_envs,
    make,
    register,
)

__all__ = [
    "DuplicateEnvironmentError",
    "EnvCheckError",
    "EnvConstructionError",
    "EnvError",
    "EnvRecord",
    "EnvSpec",
    "MissingSplitError",
    "ResetNeededError",
    "StepResult",
    "TextEnv",
    "UnknownEnvironmentError",
    "UnknownTaskError",
    "check_env",
    "cli_check",
    "list_envs",
    "make",
    "register",
]
