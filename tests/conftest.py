"""Shared fixtures: an isolated cache root, and a tiny model checkpoint built in code once per session."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fixtures_memory"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Model and game caches go to a per-session temporary root, never to the user's ~/.cache.

    The real SmolLM2 conversion is the exception: tests that need it point at the user cache on purpose.
    """
    root = tmp_path_factory.getbasetemp() / "agent-runtime-cache"
    monkeypatch.setenv("AGENT_RUNTIME_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama checkpoint (random weights, a BPE tokenizer trained on the spot, ChatML template)."""
    from agent_runtime.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir):
    from agent_runtime.llm.transformers_backend import TransformersBackend

    return TransformersBackend.from_pretrained(str(tiny_model_dir), dtype="float32")  # exact comparisons


@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    """One game cache for the whole session, so each TextWorld game is generated once."""
    return tmp_path_factory.mktemp("games")
