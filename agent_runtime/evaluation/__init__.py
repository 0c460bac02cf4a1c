"""Held-out evaluation: `evaluator` (each environment's eval split with fixed seeds, `EnvPool`), `heldout` (the
held-out set kept out of every learning input), `report` (the learning table), `continual` (a curriculum's
matrix), `tales` (the TALES protocol's scores)."""

from agent_runtime.evaluation.evaluator import EnvPool, EvalResult, close_env_pool, env_pool, evaluate

__all__ = ["EnvPool", "EvalResult", "close_env_pool", "env_pool", "evaluate"]
