"""Forget a lesson everywhere: `agent-runtime lessons forget ID`.

The plan: the lesson and what was merged from it leave the live set; adapters trained with it in the teacher's
context (and those trained on top of them) are tainted; the run goes back to the newest ancestor trained
without it, the lessons the tainted cycles had consolidated come back into the context, and a
re-consolidation is scheduled as a run request, which the loop runs as its next CONSOLIDATE. A cycle that was
training while its parent was rolled back is not promoted. End to end on a tiny model taught to take the
coin when the lesson is in its context: the lesson is consolidated (the adapter takes the coin without it),
then forgotten, and the acting policy no longer takes it on held-out games.
"""

from __future__ import annotations

import json

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation import evaluate
from agent_runtime.llm.base import activate
from agent_runtime.phases.promotion import changed_meanwhile
from agent_runtime.run.loop import AgentLoop
from agent_runtime.testing import COIN_LESSON as LESSON
from distill.lessons.forget import RECONSOLIDATE, apply_forget, plan_forget
from distill.lessons.versions import create_version, live_version
from memory import ExperienceStore


def words(text: str) -> int:
    return len(text.split())


def history(store) -> dict:
    """A run with two promoted cycles and a rejected one: A and C distilled by cycle 1 (A consolidated), D
    merged from A, cycle 2 on top of cycle 1 distilling {C, D}, cycle 3 on top of cycle 2 rolled back."""
    config = {"name": "t", "model": {"name": "scripted", "backend": "scripted"}, "envs": [{"id": "math/gsm_symbolic"}]}
    run = store.create_run("t", config_from_dict(config).model_dump(mode="json"))
    a = store.add_lesson("Take the coin.", run_id=run)
    c = store.add_lesson("Read the room first.", run_id=run)
    v1 = create_version(store, run, [a, c]).version
    ids = {"run": run, "a": a, "c": c}
    for n, (version, parent) in enumerate([(v1, None), (None, "a1"), (None, "a2")], start=1):
        if n == 2:
            ids["d"] = store.add_lesson("Take the coin when you see one.", run_id=run, metadata={"merged_from": [a]})
            version = create_version(store, run, [c, ids["d"]]).version
        if n == 3:
            version = live_version(store, run).version
        cycle = store.start_cycle(run, {}, lesson_set_version=version, base_adapter_id=ids.get(parent))
        adapter = store.add_adapter(f"cycle-{cycle}", f"/adapters/{cycle}", run_id=run, parent_id=ids.get(parent))
        store.update_cycle(cycle, adapter_id=adapter)
        if n < 3:
            store.promote_cycle(cycle, [a] if n == 1 else [])
        else:
            store.rollback_cycle(cycle, error="did not help")
        ids[f"a{n}"], ids[f"cycle{n}"] = adapter, cycle
        if n == 1:
            create_version(store, run, [c])  # cycle 1 consolidated A: it leaves the context
    return ids


def test_forgetting_a_lesson_taught_into_the_active_adapter_rolls_back_to_the_base(store):
    ids = history(store)
    plan = plan_forget(store, ids["c"])
    assert plan.forgotten == [ids["c"]] and plan.derived == {}
    assert [c.id for c in plan.tainted_cycles] == [ids["cycle1"], ids["cycle2"]]
    assert [a.id for a in plan.tainted_adapters] == [ids["a1"], ids["a2"], ids["a3"]]
    assert plan.rolls_back and plan.active.id == ids["a2"] and plan.fallback is None
    assert plan.restored == [ids["a"]], "what cycle 1 consolidated comes back: its weights are gone"
    assert any("the base model" in line for line in plan.lines())
    done = apply_forget(store, plan, count_tokens=words)
    live = live_version(store, ids["run"])
    assert live.version == done["versions"][0] and live.lesson_ids == [ids["d"], ids["a"]]
    assert store.lessons(ids["run"], ids=[ids["a"]])[0].status == "active", "in the context again"
    [forgotten] = store.lessons(ids["run"], ids=[ids["c"]])
    assert forgotten.status == "retired" and forgotten.forgotten_at is not None
    assert store.active_adapter(ids["run"]) is None
    assert {a.id: a.status for a in store.adapters(ids["run"])} == {
        ids["a1"]: "retired",
        ids["a2"]: "retired",
        ids["a3"]: "rejected",
    }
    [request] = store.requests(ids["run"], kind=RECONSOLIDATE, pending=True)
    assert request.id == done["request_id"] and request.payload["base_adapter_id"] is None


def test_forgetting_a_source_forgets_what_was_merged_from_it(store):
    ids = history(store)
    plan = plan_forget(store, ids["a"])
    assert plan.forgotten == [ids["a"], ids["d"]] and plan.derived == {ids["d"]: ids["a"]}
    # A was taught by cycle 1, D by cycle 2: both adapters are tainted, the run goes back to the base model
    assert plan.rolls_back and plan.fallback is None and plan.restored == []


def test_forgetting_a_lesson_only_the_newest_cycle_was_taught_keeps_its_parent(store):
    ids = history(store)
    plan = plan_forget(store, ids["d"])
    assert [c.id for c in plan.tainted_cycles] == [ids["cycle2"]]
    assert plan.rolls_back and plan.fallback.id == ids["a1"]
    apply_forget(store, plan, count_tokens=words)
    assert store.active_adapter(ids["run"]).id == ids["a1"]
    assert live_version(store, ids["run"]).lesson_ids == [ids["c"]]


def merged_history(store, *, consolidate_merge: bool = False) -> dict:
    """As the curator merges: B, a near-duplicate of the live A, merged into M, a new row with A's text and
    position and both provenances; the live set {M, C} is taught into cycle 1, promoted (consolidating M when
    asked, which then leaves the context)."""
    config = {"name": "t", "model": {"name": "scripted", "backend": "scripted"}, "envs": [{"id": "math/gsm_symbolic"}]}
    run = store.create_run("t", config_from_dict(config).model_dump(mode="json"))
    a = store.add_lesson("Take the coin.", run_id=run, source_episode_ids=[1])
    c = store.add_lesson("Read the room first.", run_id=run)
    create_version(store, run, [a, c])
    b = store.add_lesson("Take the coin at once.", run_id=run, source_episode_ids=[2])
    m = store.add_lesson(
        "Take the coin.",
        run_id=run,
        source_episode_ids=[1, 2],
        metadata={"merged_from": [a, b], "merged_texts": ["Take the coin at once."]},
    )
    version = create_version(store, run, [m, c]).version
    cycle = store.start_cycle(run, {}, lesson_set_version=version)
    adapter = store.add_adapter("cycle-1", "/adapters/1", run_id=run)
    store.update_cycle(cycle, adapter_id=adapter)
    store.promote_cycle(cycle, [m] if consolidate_merge else [])
    if consolidate_merge:
        create_version(store, run, [c])
    return {"run": run, "a": a, "b": b, "c": c, "m": m, "cycle": cycle, "adapter": adapter}


def test_forgetting_the_newer_source_of_a_merge_brings_the_older_back_in_its_place(store):
    """The merge showed A's text (to the agent and to cycle 1's teacher): forgetting B forgets the merge, which
    carries B's provenance, and A comes back as its own lesson where the merge stood; no adapter saw B's text."""
    ids = merged_history(store)
    plan = plan_forget(store, ids["b"])
    assert plan.forgotten == [ids["b"], ids["m"]] and plan.kept_text == plan.back_in_place == {ids["m"]: ids["a"]}
    assert plan.tainted_cycles == [] and not plan.rolls_back
    assert (
        f"#{ids['m']} was merged from #{ids['b']} but shows the text of #{ids['a']}: #{ids['a']} comes back as "
        "its own lesson in its place"
    ) in "\n".join(plan.lines())
    apply_forget(store, plan, count_tokens=words)
    live = live_version(store, ids["run"])
    assert live.lesson_ids == [ids["a"], ids["c"]] and f"#{ids['a']} back in place of #{ids['m']}" in live.note
    rows = {x.id: x for x in store.lessons(ids["run"])}
    assert rows[ids["a"]].status == "active" and rows[ids["a"]].forgotten_at is None
    assert rows[ids["a"]].source_episode_ids == [1], "its own provenance, not the forgotten lesson's"
    assert rows[ids["m"]].forgotten_at is not None and rows[ids["b"]].forgotten_at is not None
    assert store.active_adapter(ids["run"]).id == ids["adapter"]


def test_the_command_prints_which_source_comes_back_and_needs_no_yes_without_a_rollback(tmp_path, cli):
    with ExperienceStore.open(tmp_path) as store:
        ids = merged_history(store)
    text = cli("lessons", "forget", ids["b"], "--workdir", tmp_path).stdout
    assert f"#{ids['a']} comes back as its own lesson in its place (forget #{ids['a']} to remove that text)" in text
    assert "done: new lesson-set versions" in text
    with ExperienceStore.open(tmp_path) as store:
        assert live_version(store, ids["run"]).lesson_ids == [ids["a"], ids["c"]]


def test_forgetting_the_source_whose_text_a_merge_kept_forgets_the_text(store):
    ids = merged_history(store)
    plan = plan_forget(store, ids["a"])
    assert plan.forgotten == [ids["a"], ids["m"]] and plan.kept_text == {}
    assert [c.id for c in plan.tainted_cycles] == [ids["cycle"]] and plan.rolls_back and plan.fallback is None
    apply_forget(store, plan, count_tokens=words)
    assert live_version(store, ids["run"]).lesson_ids == [ids["c"]]


def test_a_merge_consolidated_into_a_kept_adapter_keeps_its_text_there(store):
    """The merge's text (A's) lives in cycle 1's weights, which forgetting B does not taint: nothing comes back
    into the context, and the plan says where the text stays."""
    ids = merged_history(store, consolidate_merge=True)
    plan = plan_forget(store, ids["b"])
    assert plan.back_in_place == {} and not plan.rolls_back and plan.live is None
    assert (
        f"#{ids['a']} does not come back: the text stays in cycle {ids['cycle']}'s adapter, which consolidated "
        f"#{ids['m']}"
    ) in "\n".join(plan.lines())
    apply_forget(store, plan, count_tokens=words)
    assert live_version(store, ids["run"]).lesson_ids == [ids["c"]]


def test_a_cycle_whose_parent_was_rolled_back_meanwhile_is_not_promoted(store):
    ids = history(store)
    parent = store.active_adapter(ids["run"])
    live = live_version(store, ids["run"])
    assert changed_meanwhile(store, ids["run"], live, parent) == []
    apply_forget(store, plan_forget(store, ids["d"]), count_tokens=words)
    reasons = changed_meanwhile(store, ids["run"], live, parent)
    assert any("the run's adapter changed during the cycle" in r for r in reasons)
    assert any(f"lessons [{ids['d']}] it was taught with were forgotten" in r for r in reasons)


def test_the_command_asks_before_it_rolls_back_an_adapter(tmp_path, cli):
    with ExperienceStore.open(tmp_path) as store:
        ids = history(store)
    proc = cli("lessons", "forget", str(ids["c"]), "--workdir", tmp_path, "--json", check=False)
    assert proc.returncode == 2
    shown = json.loads(proc.stdout)
    assert (
        shown["rolls_back"] and not shown["applied"] and shown["tainted_adapters"] == [ids["a1"], ids["a2"], ids["a3"]]
    )
    with ExperienceStore.open(tmp_path) as store:
        assert store.active_adapter(ids["run"]).id == ids["a2"], "nothing changed without --yes"
    text = cli("lessons", "forget", str(ids["c"]), "--workdir", tmp_path, "--yes").stdout
    assert "the run acts with the base model instead of adapter" in text and "run request #" in text
    proc = cli("lessons", "forget", "999", "--workdir", tmp_path, check=False)
    assert proc.returncode == 2 and "no lesson #999" in proc.stderr


# -- end to end: a behaviour consolidated, then forgotten -----------------------------------------------------


def _acting_success(loop) -> float:
    """Held-out success of the policy the run acts with now, without lessons (first decision = the game)."""
    activate(loop.backend, loop.store.active_adapter(loop.run_id))
    [result] = evaluate(loop.config, loop.workdir, loop.backend, lessons=[])
    return result.success_rate


@pytest.mark.slow
def test_a_consolidated_lesson_forgotten_leaves_the_acting_policy(tmp_path, coin_lesson_model, coin_lesson_config, cli):
    """End to end through `agent-runtime lessons forget`: without --yes nothing changes, with it the run acts
    with the base model again and the behaviour the lesson taught is gone on held-out games."""
    model_dir = coin_lesson_model
    loop = AgentLoop(coin_lesson_config("forget", model_dir, 8), tmp_path / "run", progress=False)
    base = _acting_success(loop)
    [result] = evaluate(loop.config, loop.workdir, loop.backend, lessons=[LESSON])
    assert result.success_rate - base >= 0.5, "the lesson moves the model's choice in context"
    summary = loop.run()
    assert summary.cycles == 1 and summary.adapter == "cycle-1", "the cycle was promoted"
    [lesson] = loop.store.lessons(loop.run_id)
    assert lesson.status == "consolidated", "the adapter internalised the lesson: it left the context"
    consolidated = _acting_success(loop)
    assert consolidated - base >= 0.5, "the adapter takes the coin without the lesson"
    loop.close()

    asked = cli("lessons", "forget", lesson.id, "--workdir", tmp_path / "run", check=False)
    assert asked.returncode == 2 and "pass --yes to do it" in asked.stdout
    assert "the run acts with the base model instead of adapter" in asked.stdout
    with ExperienceStore.open(tmp_path / "run") as store:
        assert store.active_adapter(loop.run_id).name == "cycle-1", "nothing changed without --yes"
        assert store.lessons(loop.run_id, ids=[lesson.id])[0].forgotten_at is None
    done = cli("lessons", "forget", lesson.id, "--workdir", tmp_path / "run", "--yes", "--json")
    assert json.loads(done.stdout)["applied"] and json.loads(done.stdout)["fallback_adapter"] is None

    loop = AgentLoop(coin_lesson_config("forget", model_dir, 8), tmp_path / "run", resume=True, progress=False)
    assert loop.adapter is None and loop.lessons.texts() == []
    after = _acting_success(loop)
    assert after == base and consolidated - after >= 0.5, "the behaviour left with the lesson"
    loop.run()  # the scheduled re-consolidation runs though the run is at its target; nothing live is left to
    # distil, so it only finishes
    assert loop.store.requests(loop.run_id, kind=RECONSOLIDATE, pending=True) == []
    assert loop.store.active_adapter(loop.run_id) is None
    loop.close()


@pytest.mark.slow
def test_the_loop_reconsolidates_the_remaining_lessons_on_top_of_the_kept_ancestor(
    tmp_path, coin_lesson_model, coin_lesson_config, cli
):
    """Two promoted cycles: the first consolidates LESSON (its adapter takes the coin), the second is taught two
    lessons a person added. Forgetting one of those (which only the second cycle was taught) takes the run back to
    cycle 1's adapter, and the loop's next CONSOLIDATE trains a new adapter on top of it with the lessons still
    live. The teacher is the taught model itself (`opcd.teacher`): with the person's lessons it does not take the
    coin, so cycle 2 has something to teach an adapter that does (with cycle 1's adapter as its own teacher it
    would not: that adapter takes the coin whatever the lessons say)."""
    workdir = tmp_path / "run"

    def config(episodes):
        return coin_lesson_config("forget", coin_lesson_model, episodes, steps=12, teacher=coin_lesson_model)

    loop = AgentLoop(config(8), workdir, progress=False)
    loop.run()
    first = loop.store.active_adapter(loop.run_id)
    assert first is not None and first.name == "cycle-1", [
        (c.error, c.metrics.get("heldout_kl")) for c in loop.store.cycles(loop.run_id)
    ]
    [seeded] = loop.store.lessons(loop.run_id)
    bad = loop.store.add_lesson(
        "Never pick anything up; look around instead.", run_id=loop.run_id, metadata={"source": "user"}
    )
    kept = loop.store.add_lesson("Look at the room before you move.", run_id=loop.run_id, metadata={"source": "user"})
    live = live_version(loop.store, loop.run_id)
    create_version(loop.store, loop.run_id, [*(live.lesson_ids if live else []), bad, kept], by_user=True)
    loop.close()

    loop = AgentLoop(config(16), workdir, resume=True, progress=False)
    loop.run()
    run_id = loop.run_id
    cycles = loop.store.cycles(run_id)
    assert [c.status for c in cycles] == ["promoted", "promoted"], [
        (c.error, c.metrics.get("heldout_kl")) for c in cycles
    ]
    second = loop.store.active_adapter(run_id)
    assert second.name == "cycle-2" and second.parent_id == first.id
    loop.close()

    shown = cli("lessons", "forget", bad, "--workdir", workdir, "--yes").stdout
    assert f"OPCD cycle {cycles[1].id} was taught with them" in shown and f"OPCD cycle {cycles[0].id} " not in shown
    assert f"the run acts with adapter #{first.id} cycle-1 instead of adapter #{second.id} cycle-2" in shown
    with ExperienceStore.open(workdir) as store:
        remaining = live_version(store, run_id).lesson_ids
        assert bad not in remaining and kept in remaining and seeded.id not in remaining

    loop = AgentLoop(config(16), workdir, resume=True, progress=False)
    assert loop.adapter.id == first.id and loop.lessons.texts() == ["Look at the room before you move."]
    loop.run()  # at its episode target: only the scheduled re-consolidation runs
    again = loop.store.cycles(run_id)[-1]
    assert len(loop.store.cycles(run_id)) == 3 and again.base_adapter_id == first.id
    assert loop.store.lesson_set(run_id, again.lesson_set_version).lesson_ids == remaining, "the lessons still live"
    assert loop.store.get_adapter(again.adapter_id).parent_id == first.id, "trained on top of cycle 1's adapter"
    [request] = loop.store.requests(run_id, kind=RECONSOLIDATE)
    assert request.done_at is not None
    loop.close()


@pytest.mark.slow
def test_distill_runs_a_scheduled_reconsolidation_now(tmp_path, cycle_config, cli):
    """`agent-runtime distill` carries out the re-consolidation `lessons forget` left, with its cycle."""
    import yaml

    config = cycle_config()
    loop = AgentLoop(config, tmp_path, progress=False)
    loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        request = store.add_request(run.id, RECONSOLIDATE, {"reason": "a test"})
    path = tmp_path / "cycle.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    report = json.loads(cli("distill", path, "--workdir", tmp_path, "--json").stdout)
    with ExperienceStore.open(tmp_path) as store:
        [done] = store.requests(run.id, kind=RECONSOLIDATE)
    assert done.id == request and done.done_at is not None and done.outcome == {"done_by": "distill"}
    assert report["status"] == "rolled_back"  # the fixture's cycle: see test_consolidate.test_cycle_in_the_loop
