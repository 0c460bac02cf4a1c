"""One long-lived agent, many environments: lesson scopes, retrieval under a budget, trials per environment, replay
in the cycle, and a curriculum's continual-learning matrix (R, ACC, BWT, FWT) that survives a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_runtime.cli import main
from agent_runtime.config import ConfigError, config_from_dict
from agent_runtime.evaluation.matrix import Matrix, load_matrix
from agent_runtime.phases.cycle import Cycle
from agent_runtime.phases.turn_prompts import Decision
from agent_runtime.run.loop import AgentLoop
from distill.lessons import live_lessons
from distill.lessons.scope import GLOBAL, ScopeError, in_scope, normalize_scope, trial_gains
from distill.lessons.versions import create_version
from memory import ExperienceStore
from memory.embeddings import HashEmbedder
from tests.continual_envs import LEFT, MIXED, RIGHT
from tests.memory.test_memory_migration import build_at_0001


def _config(**sections) -> dict:
    base = {
        "name": "continual",
        "envs": [{"id": LEFT}, {"id": RIGHT}],
        "model": {"name": "scripted", "backend": "scripted", "options": {"follow_lessons": True}},
        "runtime": {"slots": 4, "episodes": 8},
        "memory": {"embedder": "hash"},
        "evaluation": {"episodes_per_env": 4},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def _run(config: dict, workdir: Path, resume: bool = False):
    loop = AgentLoop(config_from_dict(config), workdir, resume=resume, progress=False)
    try:
        return loop.run()
    finally:
        loop.close()


# -- scope ----------------------------------------------------------------------------------------------------------


def test_a_scope_names_environments_families_or_everything() -> None:
    assert normalize_scope([LEFT, LEFT, "family:text"]) == (LEFT, "family:text")
    assert normalize_scope([LEFT, "*"]) == GLOBAL and normalize_scope(None) == GLOBAL
    with pytest.raises(ScopeError, match="not an environment of this run; its environments: a/b, c/d"):
        normalize_scope(["x/y"], known=["a/b", "c/d"])
    for bad in ["", "has space", "<b>", "family:", "x" * 201]:
        with pytest.raises(ScopeError):
            normalize_scope([bad])
    assert in_scope([LEFT], LEFT) and not in_scope([LEFT], RIGHT)
    assert in_scope(["family:text"], RIGHT, "text") and not in_scope(["family:math"], RIGHT, "text")
    assert in_scope(["*"], "anything/at-all")


def test_a_lessons_trial_gains_come_from_its_own_trials_per_environment_or_its_induction_trial() -> None:
    from types import SimpleNamespace as Lesson

    per_env = {"scope_trials": {LEFT: {"delta": 0.25}, RIGHT: {"delta": -0.5}, "x/y": {"reason": "no delta"}}}
    assert trial_gains(Lesson(metadata=per_env, scope=[LEFT])) == {LEFT: 0.25, RIGHT: -0.5}
    induced = {"trial": {"delta": 0.083, "promote": True}}
    assert trial_gains(Lesson(metadata=induced, scope=[LEFT, "*"])) == {LEFT: 0.083}
    assert trial_gains(Lesson(metadata={"trial": "unreadable"}, scope=[LEFT])) == {}
    odd = {"scope_trials": {LEFT: {"delta": float("nan")}, RIGHT: {"delta": True}, "x/y": {"delta": 7}}}
    assert trial_gains(Lesson(metadata=odd, scope=["*"])) == {}  # imported metadata: nothing that is not a rate gap
    assert trial_gains(Lesson(metadata=None, scope=["*"])) == {}


def test_a_lesson_stored_before_scopes_is_shown_everywhere(memory_url: str, tmp_path: Path) -> None:
    build_at_0001(memory_url)
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as store:
        lessons = store.lessons(1)
        assert lessons and all(x.scope == ["*"] for x in lessons)


def _live(store: ExperienceStore, run_id: int, specs: list[tuple[str, list[str]]]) -> list[int]:
    ids = [store.add_lesson(text, run_id=run_id, scope=scope, token_count=len(text.split())) for text, scope in specs]
    create_version(store, run_id, ids)
    return ids


def test_the_most_relevant_lesson_is_chosen_when_more_are_in_scope_than_the_budget_holds(tmp_path: Path) -> None:
    """Four lessons for every environment, room for one: each episode gets the one about its own room, recorded as
    the lesson it had in context."""
    texts = [
        "In the red hall the left door is the way out.",
        "In the blue cellar the right door is the way out.",
        "Waiting in the green attic never helps.",
        "The yellow garden has no doors at all.",
    ]
    config = _config(lessons={"seed": texts, "context_lessons": 1, "gate_episodes": 0, "pools": 1})
    summary = _run(config, tmp_path)
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, summary.run_id)
        by_text = {x.text: x.id for x in live}
        episodes = [store.episode(e.id) for e in store.episodes(summary.run_id)]
        assert len(episodes) == 8 and {e.env_id for e in episodes} == {LEFT, RIGHT}
        own = {LEFT: by_text[texts[0]], RIGHT: by_text[texts[1]]}
        assert all(e.lessons_in_context == [own[e.env_id]] for e in episodes)


def test_a_lesson_that_helps_one_environment_and_hurts_another_goes_live_only_in_the_first(tmp_path: Path) -> None:
    """'Always reply: left' wins every left-room game and loses every right-room one: proposed for every
    environment, its trial lets it into the left room only; right-room episodes never see it."""
    config = _config(
        lessons={"enabled": True, "seed": ["Always reply: left"], "gate_episodes": 8, "gate_split": "train"},
        runtime={"episodes": 12},
    )
    config["lessons"]["extract_every"] = 1000
    summary = _run(config, tmp_path)
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, summary.run_id)
        [lesson] = live
        assert lesson.scope == [LEFT]
        assert lesson.metadata["proposed_scope"] == ["*"]
        trials = lesson.metadata["scope_trials"]
        assert trials[LEFT]["candidate_rate"] == 1.0 > trials[LEFT]["current_rate"]
        assert trials[RIGHT]["candidate_rate"] == 0.0 < trials[RIGHT]["current_rate"]
        gates = {e.env_id: e.metrics for e in store.evaluations(summary.run_id, kind="gate")}
        assert set(gates) == {LEFT, RIGHT} and gates[LEFT]["promote"] and not gates[RIGHT]["promote"]
        episodes = [store.episode(e.id) for e in store.episodes(summary.run_id)]
        assert all(e.won and e.lessons_in_context == [lesson.id] for e in episodes if e.env_id == LEFT)
        assert all(e.lessons_in_context == [] for e in episodes if e.env_id == RIGHT)


def _seeded_everywhere(texts: list[str], *, gate_episodes: int = 8, episodes: int = 12, **sections) -> dict:
    """A run whose person's lessons `texts` are proposed for every environment and gated on the train games."""
    lessons = {"enabled": True, "seed": texts, "gate_episodes": gate_episodes, "gate_split": "train"}
    return _config(lessons={**lessons, "extract_every": 1000}, runtime={"episodes": episodes}, **sections)


def test_lessons_proposed_everywhere_together_each_go_live_where_their_own_trial_raised_success(tmp_path: Path) -> None:
    """'Always reply: left' and 'Always reply: right' seeded together: the set's trial shows each room one policy, so
    it cannot say which lesson won where; each is tried alone, and each goes live only in the room it wins."""
    summary = _run(_seeded_everywhere(["Always reply: left", "Always reply: right"]), tmp_path)
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, summary.run_id)
        scopes = {x.text: x.scope for x in live}
        assert scopes == {"Always reply: left": [LEFT], "Always reply: right": [RIGHT]}
        by_text = {x.text: x for x in live}
        for text, wins, loses in (("Always reply: left", LEFT, RIGHT), ("Always reply: right", RIGHT, LEFT)):
            trials = by_text[text].metadata["scope_trials"]  # the lesson's own trial, not the set's
            assert trials[wins]["candidate_rate"] == 1.0 > trials[wins]["current_rate"]
            assert trials[loses]["candidate_rate"] == 0.0 < trials[loses]["current_rate"]
        episodes = [store.episode(e.id) for e in store.episodes(summary.run_id)]
        assert episodes and all(e.won and len(e.lessons_in_context) == 1 for e in episodes)


def test_lessons_that_each_help_alone_but_hurt_together_go_live_one_at_a_time(tmp_path: Path, capsys) -> None:
    """In the mixed room either 'Always reply' lesson alone wins half the games, and the two together contradict
    each other (the scripted policy then follows neither): each one's own trial lets it in there, the combination's
    trial does not, so only the first goes live there; the left room lets in only the left lesson. Without the
    combination's trial both would go live in the mixed room and it would win nothing."""
    config = _seeded_everywhere(
        ["Always reply: left", "Always reply: right"],
        envs=[{"id": LEFT}, {"id": MIXED}],
        model={"options": {"follow_lessons": True, "mode": "fixed", "fixed_answer": "wait"}},
    )
    summary = _run(config, tmp_path)
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, summary.run_id)
        assert {x.text: x.scope for x in live} == {"Always reply: left": [LEFT, MIXED]}
        [left] = live
        trials = left.metadata["scope_trials"]
        assert trials[MIXED]["candidate_rate"] > trials[MIXED]["current_rate"] == 0.0
        together = trials[MIXED]["together"]
        assert together["candidate_rate"] == 0.0 and len(together["with"]) == 1 and "together" not in trials[LEFT]
        [right] = store.lessons(summary.run_id, ids=together["with"])
        assert right.text == "Always reply: right"
        mixed = [store.episode(e.id) for e in store.episodes(summary.run_id, env_id=MIXED)]
        assert mixed and all(e.lessons_in_context == [left.id] for e in mixed)
        assert any(e.won for e in mixed)
    assert main(["lessons", "show", str(left.id), "--workdir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert f"together with #{right.id}: 0.00 -> 0.00" in shown, shown
    from fastapi.testclient import TestClient

    from agent_runtime.dashboard import create_app

    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        page = client.get(f"/lessons/{left.id}").text
    assert f"together with lesson #{right.id}: 0.0% &rarr; 0.0%" in page, page


def test_lessons_that_help_more_together_than_alone_go_live_together(tmp_path: Path) -> None:
    """In the left room 'wait never helps.' and 'right never helps.' each leave the random policy two doors of
    three, and together only the winning one: the combination beats the best of them alone, so both go live there."""
    summary = _run(
        _seeded_everywhere(["Wait never helps.", "Right never helps."], gate_episodes=12, episodes=4), tmp_path
    )
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, summary.run_id)
        by_text = {x.text: x for x in live}
        assert LEFT in by_text["Wait never helps."].scope and by_text["Right never helps."].scope == [LEFT]
        together = by_text["Right never helps."].metadata["scope_trials"][LEFT]["together"]
        assert together["candidate_rate"] == 1.0 and together["with"] == [by_text["Wait never helps."].id]
        alone = [x.metadata["scope_trials"][LEFT]["candidate_rate"] for x in live]
        assert all(0.0 < rate < 1.0 for rate in alone), alone


def test_lessons_add_takes_the_environments_of_the_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(lessons={"gate_episodes": 0})))
    work = tmp_path / "w"
    assert (
        main(["lessons", "add", "Go left.", "--env", "nowhere/x", "--config", str(path), "--workdir", str(work)]) == 2
    )
    err = capsys.readouterr().err
    assert "nowhere/x" in err and LEFT in err and RIGHT in err
    assert main(["lessons", "add", "Go left.", "--env", LEFT, "--config", str(path), "--workdir", str(work)]) == 0
    capsys.readouterr()
    with ExperienceStore.open(work, read_only=True) as store:
        assert [x.scope for x in live_lessons(store, store.runs()[-1].id)[1]] == [[LEFT]]
    assert main(["lessons", "list", "--workdir", str(work)]) == 0
    assert f"({LEFT})" in capsys.readouterr().out


# -- the cycle: each prompt its environment's lessons, the rest replayed --------------------------------------------


def test_a_cycle_teaches_each_prompt_its_environments_lessons_and_replays_the_others(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(16)) as store:
        run_id = store.create_run("r", {})
        _live(store, run_id, [("Take the left door.", [LEFT])])
        _, lessons = live_lessons(store, run_id)
    cycle = Cycle(1, "lessons", None, None, lessons, None, ["ctx"], None, {}, families={LEFT: "text", RIGHT: "text"})
    left, right, other = (Decision([{"role": "user", "content": "?"}], [], None, env) for env in (LEFT, RIGHT, None))
    assert "Take the left door." in cycle.contexts_for(left)[0]
    assert cycle.contexts_for(right) == [""]
    taught, replay = cycle.taught([left, right])
    assert taught == [left] and replay == [right]
    assert cycle.contexts_for(other) == ["ctx"]  # a prompt of no environment: the whole set, as before scopes
    shown = cycle.shown()["lessons"]
    assert [(x.text, x.scope) for x in shown] == [("Take the left door.", (LEFT,))]


def test_a_cycle_takes_the_recent_episodes_of_each_environment_the_run_is_playing(tmp_path: Path) -> None:
    """Two environments played side by side: each gives the cycle its own newest `recent_episodes`, as it would
    alone (not a share of one window); an environment not among the newest episodes is only rehearsed."""
    from agent_runtime.llm.scripted import ScriptedBackend
    from agent_runtime.phases.turn_prompts import active_envs, episode_prefixes, recent_decisions
    from agent_runtime.state import Run

    config = config_from_dict(_config(runtime={"episodes": 12}, opcd={"recent_episodes": 4}))
    _run(config.model_dump(mode="json"), tmp_path)
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(16)) as store:
        run = Run(config, tmp_path, store, store.runs()[-1].id)
        backend = ScriptedBackend()
        assert sorted(active_envs(run)) == sorted([LEFT, RIGHT])
        newest = {env: [e.id for e in store.episodes(run.id, env_id=env, limit=4)] for env in (LEFT, RIGHT)}
        assert all(len(ids) == 4 for ids in newest.values())
        taken = recent_decisions(run, backend)
        assert sorted(i for d in taken for i in d.episode_ids) == sorted(newest[LEFT] + newest[RIGHT])
        assert len(taken) == 8 > len(episode_prefixes(run, backend, 4))  # one window of 4 would give half
        assert {d.env_id for d in taken} == {LEFT, RIGHT}


# -- a curriculum ------------------------------------------------------------------------------------------------


def _curriculum(**extra) -> dict:
    config = _config(
        curriculum={
            "eval_episodes": 4,
            "phases": [{"envs": [LEFT], "episodes": 8}, {"envs": [RIGHT], "episodes": 8}],
            **extra,
        },
        lessons={"enabled": True, "seed": ["Always reply: left"], "gate_episodes": 4, "gate_split": "train"},
    )
    config["lessons"]["extract_every"] = 1000
    del config["runtime"]["episodes"]
    return config


def test_a_curriculum_names_only_the_runs_environments() -> None:
    with pytest.raises(ConfigError, match="name environments the run does not list in envs: nowhere/x"):
        config_from_dict(_config(curriculum={"phases": [{"envs": ["nowhere/x"], "episodes": 4}]}))
    with pytest.raises(ConfigError, match="phases add up to 16"):
        config_from_dict({**_curriculum(), "runtime": {"episodes": 10}})
    assert config_from_dict(_curriculum()).runtime.episodes == 16


@pytest.mark.slow
def test_a_curriculum_run_fills_the_matrix_and_resumes_mid_phase(tmp_path: Path, monkeypatch, capsys) -> None:
    """Phase 1 plays the left room only, phase 2 the right room only; after each (and before the first) every room
    is assessed. The run is stopped after phase 1's assessment and killed inside phase 2's: resumed, it plays the
    same draws, and each assessment is stored exactly once."""
    config = _curriculum()
    real = AgentLoop._assess
    calls: list[int] = []

    def assess_then_stop(self) -> None:
        calls.append(self.state.assessed)
        if self.state.assessed == 2 and calls.count(2) == 1:
            raise RuntimeError("killed inside the assessment")
        real(self)
        if self.state.assessed == 2:
            self.stop_requested = True

    monkeypatch.setattr(AgentLoop, "_assess", assess_then_stop)
    first = _run(config, tmp_path)
    assert first.episodes == 8 and calls == [0, 1]
    with pytest.raises(RuntimeError, match="killed inside"):
        _run(config, tmp_path, resume=True)
    summary = _run(config, tmp_path, resume=True)
    assert summary.episodes == 16 and calls == [0, 1, 2, 2]
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        episodes = sorted(store.episodes(summary.run_id), key=lambda e: e.id)
        assert [e.env_id for e in episodes] == [LEFT] * 8 + [RIGHT] * 8
        rows = [e for e in store.evaluations(summary.run_id, kind="eval") if "continual" in e.metrics]
        assert sorted((e.metrics["continual"]["after_phase"], e.env_id) for e in rows) == [
            (i, env) for i in range(3) for env in sorted([LEFT, RIGHT])
        ]
        matrix = load_matrix(store, summary.run_id, config_from_dict(config).curriculum, [LEFT, RIGHT])
    assert matrix.complete()
    # the start row is the agent before any lesson; the person's lesson then went live in the left room only
    assert matrix.rate(0, LEFT) < 1.0 and matrix.rate(1, LEFT) == 1.0 and matrix.rate(2, LEFT) == 1.0
    capsys.readouterr()
    assert main(["report", "--workdir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["continual"]["R"][1][0] == 1.0 and report["continual"]["acc"]["value"] is not None
    assert main(["report", "--workdir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "Continual-learning matrix" in text and "ACC" in text and "BWT" in text and "FWT" in text
    from fastapi.testclient import TestClient

    from agent_runtime.dashboard import create_app

    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        page = client.get("/learning").text
    assert "Continual learning: every environment after each phase" in page
    assert page.count("<polyline") == 2 and "100%" in page  # a curve per environment; the left room won after phase 1


def test_the_matrix_statistics() -> None:
    """Two environments learned in phases 1 and 2; R (4 games each):
    start a 0.25 b 0.50; after 1: a 1.00 b 0.75; after 2: a 0.75 b 1.00."""
    games = {0.25: [True, False, False, False], 0.5: [True, True, False, False], 0.75: [True, True, True, False]}
    games[1.0] = [True] * 4
    matrix = Matrix(["start", "a", "b"], ["a", "b"], {"a": 1, "b": 2})
    for (row, env), rate in {(0, "a"): 0.25, (0, "b"): 0.5, (1, "a"): 1.0, (1, "b"): 0.75}.items():
        matrix.cells[(row, env)] = games[rate]
    matrix.cells[(2, "a")], matrix.cells[(2, "b")] = games[0.75], games[1.0]
    acc, (lo, hi) = matrix.acc()
    assert acc == pytest.approx(0.875) and lo <= acc <= hi
    assert matrix.bwt()[0] == pytest.approx(-0.25)  # a: 0.75 at the end against 1.00 once learned
    assert matrix.fwt()[0] == pytest.approx(0.25)  # b before its phase: 0.75 against 0.50 at the start
    assert matrix.drops() == {"a": pytest.approx(-0.25)}
    table = matrix.table()
    assert "ACC 87.5%" in table and "BWT -25.0 points" in table and "FWT +25.0 points" in table


def test_a_cycle_that_costs_any_environment_on_its_validation_games_is_rolled_back() -> None:
    """The no-regression check looks at every environment of the run on train-split validation games, with and
    without the lessons: one the run has not played yet counts too (the curriculum's seed 1 lost treasure-hunter
    to a coin-collector cycle before it met treasure-hunter)."""
    from agent_runtime.config import ConsolidationConfig
    from agent_runtime.phases.promotion import decide_promotion

    opcd = ConsolidationConfig(validation_games=12)
    rates = {"validation_student": 0.6, "validation_parent": 0.5}
    by_env = {
        "validation_student": {LEFT: 0.9, RIGHT: 0.5},
        "validation_parent": {LEFT: 0.5, RIGHT: 0.5},
        "validation_student_with_lessons": {LEFT: 1.0, RIGHT: 0.25},
        "validation_parent_with_lessons": {LEFT: 1.0, RIGHT: 0.75},
    }
    [reason] = decide_promotion(rates, 0.2, 0.05, opcd, by_env=by_env)
    assert f"with lessons on {RIGHT}'s validation games" in reason
    by_env["validation_student_with_lessons"][RIGHT] = 0.75
    assert decide_promotion(rates, 0.2, 0.05, opcd, by_env=by_env) == []


def test_a_with_lessons_condition_plays_only_the_environments_a_lesson_is_in_scope_for() -> None:
    """Elsewhere the prompt is the one without lessons and greedy play repeats itself: those games are reused."""
    from types import SimpleNamespace

    from agent_runtime.evaluation import EvalResult
    from agent_runtime.phases import cycle_evaluation
    from distill.lessons.scope import ScopedLesson

    played = []

    def fake_evaluate(backend, *, lessons, episodes_per_env, envs=None, context=None, split="eval", first=0):
        played.append([e.id for e in envs])
        return [EvalResult(e.id, [{"won": True, "seed": 1}]) for e in envs]

    run = SimpleNamespace(
        config=config_from_dict(_config()), families={LEFT: "text", RIGHT: "text"}, evaluate=fake_evaluate
    )
    without = [EvalResult(LEFT, [{"won": False, "seed": 1}]), EvalResult(RIGHT, [{"won": False, "seed": 1}])]
    shown = {"lessons": [ScopedLesson("Go left.", (LEFT,))]}
    got = cycle_evaluation._with_lessons(run, None, 4, shown, without)
    assert played == [[LEFT]] and [r.env_id for r in got] == [LEFT, RIGHT]
    assert got[0].successes == 1 and got[1] is without[1]
