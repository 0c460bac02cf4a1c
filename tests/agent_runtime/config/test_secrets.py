"""Secrets are never written: a database password or an API key in a config reaches neither `runs.config`, nor
`config.resolved.yaml`, nor an export; a resumed run takes them back from the config the user gives."""

from __future__ import annotations

import json

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore
from memory.redaction import REDACTED, redact_secrets, restore_secrets

SECRET = "s3cret-pw"


def test_secret_keys_and_url_passwords_are_redacted_and_nothing_else():
    config = {
        "model": {
            "options": {
                "kwargs": {
                    "api_key": "sk-123",
                    "base_url": f"http://me:{SECRET}@h:8/v1",
                    "model": "m",
                    "temperature": 0.5,
                }
            }
        },
        "memory": {"url": f"postgresql+psycopg://agent:{SECRET}@db:5432/agent"},
        "list": [{"OPENAI_API_KEY": "x", "password": None, "tokens": 3, "max_tokens": 4}],
    }
    redacted = redact_secrets(config)
    assert SECRET not in json.dumps(redacted) and "sk-123" not in json.dumps(redacted)
    assert redacted["model"]["options"]["kwargs"] == {
        "api_key": REDACTED,
        "base_url": f"http://me:{REDACTED}@h:8/v1",
        "model": "m",
        "temperature": 0.5,
    }
    assert redacted["memory"]["url"] == f"postgresql+psycopg://agent:{REDACTED}@db:5432/agent"
    assert redacted["list"] == [{"OPENAI_API_KEY": REDACTED, "password": None, "tokens": 3, "max_tokens": 4}]
    assert restore_secrets(redacted, config) == config
    other = {**config, "memory": {"url": "postgresql+psycopg://agent:x@elsewhere:5432/agent"}}
    assert restore_secrets(redacted, other)["memory"]["url"] == redacted["memory"]["url"], (
        "a secret is taken back only where the rest of the value is the same"
    )


def chat_config(episodes: int) -> dict:
    return {
        "name": "t",
        "envs": [{"id": "math/gsm_symbolic"}],
        "runtime": {"episodes": episodes},
        "model": {
            "name": "remote",
            "backend": "chat",
            "options": {
                "class": "agent_runtime.llm.fake_chat:ServedModelChat",
                "kwargs": {"model": "base", "base_url": f"http://me:{SECRET}@127.0.0.1:9/v1"},
            },
        },
    }


def test_a_run_stores_no_secret_and_resumes_with_the_given_one(tmp_path):
    loop = AgentLoop(config_from_dict(chat_config(2)), tmp_path, progress=False)
    loop.run()
    loop.close()
    assert SECRET not in (tmp_path / "config.resolved.yaml").read_text()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        assert SECRET not in json.dumps(run.config) and REDACTED in json.dumps(run.config)
        store.export_jsonl(tmp_path / "export.jsonl")
    assert SECRET not in (tmp_path / "export.jsonl").read_text()
    loop = AgentLoop(config_from_dict(chat_config(4)), tmp_path, resume=True, progress=False)
    assert SECRET in loop.config.model.options["kwargs"]["base_url"], "the resumed run has its secret back"
    assert loop.run().episodes == 4
    loop.close()


def test_exports_of_older_stores_are_redacted(tmp_path):
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("t", {"model": {"name": "m"}})
        with store.engine.begin() as conn:  # a row written before redaction existed
            conn.exec_driver_sql(
                "UPDATE runs SET config = ? WHERE id = ?",
                (json.dumps({"memory": {"url": f"postgresql://a:{SECRET}@h/d"}}), run_id),
            )
        store.export_jsonl(tmp_path / "export.jsonl")
    assert SECRET not in (tmp_path / "export.jsonl").read_text()
