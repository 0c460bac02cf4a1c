"""Held-out evaluation: `evaluator` (each environment's eval split with fixed seeds, `EnvPool`), `heldout` (the
held-out set kept out of every learning input), `cycle_table` (a cycle's learning table), `matrix` (a curriculum's
continual-learning matrix), `rounds` (each round's record), `drift` (the adapter's drift from the base model),
`tales` (the TALES protocol's scores)."""

from agent_runtime.evaluation.evaluator import EnvPool, EvalResult, close_env_pool, env_pool, evaluate

__all__ = ["EnvPool", "EvalResult", "close_env_pool", "env_pool", "evaluate"]
