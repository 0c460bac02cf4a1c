"""The shared game cache (`environments.game_cache`): a second workdir plays without generating, games that
differ never share an entry, damaged entries are rebuilt, and concurrent builders all get a complete game.

Every test points AGENT_RUNTIME_CACHE at its own temporary folder (never the user's ~/.cache) and uses level-1
coin-collector games (about a second each to generate) or a cheap fake build.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

import environments
from agent_runtime.config import config_from_dict
from agent_runtime.episode.build import build_envs
from environments import game_cache
from environments import textworld_games as tw
from environments.game_cache import STALE_AFTER_S, GameCacheError, cached_entry, run_games_dir


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "shared-cache"
    monkeypatch.setenv("AGENT_RUNTIME_CACHE", str(root))
    return root


@pytest.fixture
def generations(monkeypatch) -> list[str]:
    """The task ids TextWorld generated a game for, in order (generation still happens)."""
    calls: list[str] = []
    real = tw.TextWorldEnv._generate

    def counted(self, task_id, folder):
        calls.append(task_id)
        return real(self, task_id, folder)

    monkeypatch.setattr(tw.TextWorldEnv, "_generate", counted)
    return calls


def _coin(cache_dir=None, **settings):
    return environments.make(
        "textworld/coin_collector", level=settings.pop("level", 1), cache_dir=cache_dir, n_train=2, n_eval=1, **settings
    )


def _start_playing(workdir: Path) -> list[str]:
    """What a run does before its first move: build the config's environments, reset every train task."""
    config = config_from_dict(
        {
            "name": "cache",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [
                {"id": "textworld/coin_collector", "max_steps": 3, "kwargs": {"level": 1, "n_train": 2, "n_eval": 1}}
            ],
            "runtime": {"episodes": 1},
            "memory": {"embedder": "hash"},
        }
    )
    specs, tasks = build_envs(config, workdir)
    env = specs[0].factory()
    try:
        return [env.reset(task_id=task)[0] for task in tasks[0]]
    finally:
        env.close()


@pytest.mark.slow
def test_second_workdir_starts_playing_without_generating(tmp_path, cache_root, generations):
    from environments.game_cache import BUILT

    before = dict(BUILT)
    first = _start_playing(tmp_path / "run-a")
    assert sorted(generations) == ["train-0", "train-1"]
    assert BUILT["games"] == before["games"] + 2 and BUILT["seconds"] > before["seconds"]  # the run's profile
    second = _start_playing(tmp_path / "run-b")
    assert sorted(generations) == ["train-0", "train-1"]  # nothing generated for the second workdir
    assert BUILT["games"] == before["games"] + 2
    assert second == first
    assert not (tmp_path / "run-a" / "games").exists() and not (tmp_path / "run-b" / "games").exists()
    assert len(list((cache_root / "games" / "textworld").glob("*/game.z8"))) == 2


@pytest.mark.slow
def test_explicit_cache_dir_wins_and_old_workdirs_keep_their_games(tmp_path, cache_root, generations):
    assert run_games_dir(tmp_path / "new") == cache_root / "games"
    (tmp_path / "old" / "games").mkdir(parents=True)
    assert run_games_dir(tmp_path / "old") == tmp_path / "old" / "games"
    mine = tmp_path / "mine"
    assert _coin(mine).game_file("train-0").is_relative_to(mine / "textworld")
    # an old flat `<key>.z8` + `<key>.json` pair (the layout before the shared cache) is read, not regenerated
    env = _coin(tmp_path / "old" / "games")
    key, built = env.game_key("train-0"), mine / "textworld" / env.game_key("train-0")
    legacy = tmp_path / "old" / "games" / "textworld"
    legacy.mkdir()
    for suffix in ("z8", "json"):
        (legacy / f"{key}.{suffix}").write_bytes((built / f"game.{suffix}").read_bytes())
    assert env.game_file("train-0") == legacy / f"{key}.z8"
    assert env.reset(task_id="train-0")[0]
    env.close()
    assert generations == ["train-0"]


@pytest.mark.slow
def test_different_options_never_share_an_entry(cache_root, generations, monkeypatch):
    level1, level2 = _coin(level=1), _coin(level=2)
    paths = {
        level1.game_file("train-0"),
        level1.game_file("train-1"),
        level1.game_file("eval-0"),
        level2.game_file("train-0"),
    }
    assert len({p.parent for p in paths}) == 4 and len(generations) == 4
    assert level1.game_key("eval-0") != level1.game_key("train-0") != level2.game_key("train-0")
    import textworld

    key, ours, theirs = level1.game_key("train-0"), tw._GENERATOR_VERSION, textworld.__version__
    monkeypatch.setattr(tw, "_GENERATOR_VERSION", ours + "-next")
    assert level1.game_key("train-0") != key  # our generator changed: a new entry
    monkeypatch.setattr(tw, "_GENERATOR_VERSION", ours)
    monkeypatch.setattr(textworld, "__version__", theirs + "-next")
    assert level1.game_key("train-0") != key  # TextWorld changed: a new entry
    treasure = environments.make("textworld/treasure_hunter", level=1, n_train=2, n_eval=1)
    assert treasure.game_key("train-0") != _coin(level=1).game_key("train-0")


@pytest.mark.slow
def test_a_damaged_or_partial_entry_is_regenerated(cache_root, generations):
    env = _coin()
    key = env.game_key("train-0")
    root = cache_root / "games" / "textworld"
    root.mkdir(parents=True)
    # a killed process's leftover: a temporary folder holding half a game, one old and one recent
    old, young = root / f".gen-{key}-old", root / f".gen-{key}-young"
    for folder in (old, young):
        folder.mkdir()
        (folder / "game.z8").write_bytes(b"half")
    os.utime(old, (time.time() - STALE_AFTER_S - 60,) * 2)
    path = env.game_file("train-0")
    assert path == root / key / "game.z8" and generations == ["train-0"]  # the temporary folder was not used
    assert not old.exists() and young.exists()  # stale leftovers are cleaned, a possibly live build is not
    good = path.read_bytes()
    (root / key / "game.json").unlink()  # an entry missing one of its files
    assert env.game_file("train-0") == path and generations == ["train-0", "train-0"]
    assert (root / key / "game.json").stat().st_size > 0
    path.write_bytes(b"")  # an empty file
    assert env.game_file("train-0") == path and len(generations) == 3
    assert path.read_bytes()[:18] == good[:18] and path.stat().st_size == len(good)  # same game (serial aside)
    assert env.reset(task_id="train-0")[0]
    env.close()
    assert not [p for p in root.iterdir() if p.name.startswith(".trash-")]


def test_a_failed_build_leaves_nothing_in_place(tmp_path):
    def half(folder):
        (folder / "a").write_text("x")  # `b` never written

    with pytest.raises(GameCacheError, match="wrote no"):
        cached_entry(tmp_path, "k", ("a", "b"), half, inputs={})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks"]

    def boom(folder):
        raise ValueError("generator failed")

    with pytest.raises(ValueError, match="generator failed"):
        cached_entry(tmp_path, "k", ("a",), boom, inputs={})
    assert not (tmp_path / "k").exists()


def test_two_threads_generating_one_game_both_get_it_complete(cache_root, generations):
    results: list[Path] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def play():
        env = _coin()
        try:
            barrier.wait()
            results.append(env.game_file("train-0"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=play) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(results)) == 1 and generations == ["train-0"]  # the second waited, then read
    env = _coin()
    assert env.reset(task_id="train-0")[0]
    env.close()


def _slow_build(log: str, folder: Path) -> None:
    with open(log, "a") as out:
        out.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    (folder / "game.z8").write_text("z" * 1000)
    time.sleep(0.2)
    (folder / "game.json").write_text('{"game": 1}')


def _build_in_child(root: str, log: str, start: float) -> tuple[str, str, str]:
    time.sleep(max(0.0, start - time.time()))  # both children ask at the same moment
    folder = cached_entry(Path(root), "key", ("game.z8", "game.json"), lambda tmp: _slow_build(log, tmp), inputs={})
    return str(folder), (folder / "game.z8").read_text(), (folder / "game.json").read_text()


def test_two_processes_asking_for_one_game_both_read_it_complete(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    start = time.time() + 1.0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.starmap(_build_in_child, [(str(root), str(log), start)] * 2)
    assert results[0] == results[1] == (str(root / "key"), "z" * 1000, '{"game": 1}')
    assert len(log.read_text().split()) == 1  # the lock made the second process wait and read the first's game
    assert sorted(p.name for p in root.iterdir()) == [".locks", "key"]


def test_without_a_lock_the_rename_still_settles_the_race(tmp_path, monkeypatch):
    monkeypatch.setattr(game_cache, "_locked", lambda *args: contextlib.nullcontext())
    log, results = tmp_path / "builds.log", []
    barrier = threading.Barrier(2)

    def ask():
        barrier.wait()
        folder = cached_entry(
            tmp_path / "cache", "key", ("game.z8", "game.json"), lambda tmp: _slow_build(str(log), tmp), inputs={}
        )
        results.append((folder, (folder / "game.z8").read_text(), (folder / "game.json").read_text()))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(log.read_text().split()) == 2  # both built ...
    assert results == [(tmp_path / "cache" / "key", "z" * 1000, '{"game": 1}')] * 2  # ... both read one game
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["key"]  # the loser's copy is gone
