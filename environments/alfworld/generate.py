"""Offline generation of ALFWorld-style games from what the `alfworld` wheel ships.

The official ALFWorld games are ALFRED trajectories replayed in AI2-THOR and dumped as TextWorld PDDL
games (`game.tw-pddl` + `traj_data.json`). Without THOR or the 2 GB data download we build the same
kind of file directly:

- the room: a `gen/layouts/FloorPlan<N>-openable.json` scene gives its receptacle instances and where
  the agent stands to reach each one (its pose becomes a PDDL location); `FloorPlan<N>-objects.json`
  lists the object classes that exist in that scene;
- the objects: each placeable class of the scene gets 1-3 instances, each put in a receptacle that
  `gen/constants.VAL_RECEPTACLE_OBJECTS` says can hold it; the cleanable/heatable/coolable/toggleable
  flags come from `constants.VAL_ACTION_OBJECTS`, openable receptacles from
  `constants.OPENABLE_CLASS_LIST`;
- the task: a task type, a target object class and a target receptacle class that make sense in the
  scene (a sink for cleaning, a microwave for heating, a fridge for cooling, two instances for
  pick_two, a lamp for look_at), its PDDL goal and its wording from `gen/goal_library.py`;
- the file: the domain `data/alfred.pddl`, the grammar `data/alfred.twl2` with the task sentence in
  place of "UNKNOWN GOAL", and our problem, in the official `game.tw-pddl` layout, next to a
  `traj_data.json` holding the task parameters that alfworld's hand-coded expert reads.

Names follow ALFRED ids ("Cabinet|+00.68|+00.50|-02.20" mangled to "Cabinet_bar__plus_00_dot_68...").
The sink keeps its official two-part id "Sink|...|SinkBasin": alfworld's demangler appends "basin"
to ids containing "basin", so this reads "sinkbasin 1", whereas an id starting "SinkBasin|" would read
"sinkbasinbasin 1".

Whether the game is solvable is not decided here: `environments.alfworld.env` runs alfworld's own
hand-coded expert on every generated game and offers only those it solves.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TASK_TYPES = (
    "pick_and_place_simple",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
    "look_at_obj_in_light",
)
_TOOL_RECEPTACLE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
_TOOL_FLAG = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOLDERS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
MAX_INSTANCES = 3
MAX_OBJECT_CLASSES = 12


def _alfworld_root() -> Path:
    import alfworld

    return Path(alfworld.__file__).parent


def mangle(alfred_id: str) -> str:
    """ALFRED id -> PDDL name, as the official games spell it."""
    for old, new in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_")):
        alfred_id = alfred_id.replace(old, new)
    return alfred_id


@dataclass(frozen=True)
class Scene:
    """One AI2-THOR floor plan as the wheel describes it."""

    number: int
    object_classes: tuple[str, ...]
    receptacles: dict[str, tuple[float, float, int, int]]  # ALFRED id -> (x, z, rotation, horizon)

    def receptacle_class(self, alfred_id: str) -> str:
        parts = alfred_id.split("|")
        return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def available_scenes() -> list[int]:
    """Floor-plan numbers that have both layout files in the wheel."""
    layouts = _alfworld_root() / "gen" / "layouts"
    numbers = []
    for path in layouts.glob("FloorPlan*-openable.json"):
        number = path.name[len("FloorPlan") : -len("-openable.json")]
        if number.isdigit() and (layouts / f"FloorPlan{number}-objects.json").exists():
            numbers.append(int(number))
    return sorted(numbers)


@cache
def load_scene(number: int) -> Scene:
    layouts = _alfworld_root() / "gen" / "layouts"
    objects = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    openable = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    receptacles = {rid: (float(p[0]), float(p[1]), int(p[2]), int(p[3])) for rid, p in sorted(openable.items())}
    return Scene(number, tuple(sorted(set(objects))), receptacles)


@dataclass
class GeneratedGame:
    """A game ready to be written: the tw-pddl payload and the trajectory metadata the expert reads."""

    task_type: str
    scene: int
    pddl_params: dict[str, Any]
    task_description: str
    game_data: dict[str, Any] = field(default_factory=dict)

    def traj_data(self) -> dict[str, Any]:
        return {
            "task_type": self.task_type,
            "pddl_params": self.pddl_params,
            "scene": {"floor_plan": f"FloorPlan{self.scene}"},
            "generated_by": "agent-runtime",
            "turk_annotations": {"anns": [{"task_desc": self.task_description}]},
        }

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "traj_data.json").write_text(json.dumps(self.traj_data(), indent=1))
        path = directory / "game.tw-pddl"
        path.write_text(json.dumps(self.game_data))
        return path


def _placeable(constants: Any) -> dict[str, list[str]]:
    """object class -> receptacle classes that can hold it."""
    holders: dict[str, list[str]] = {}
    for receptacle, objects in constants.VAL_RECEPTACLE_OBJECTS.items():
        for obj in objects:
            if obj in constants.OBJECTS and "Sliced" not in obj:
                holders.setdefault(obj, []).append(receptacle)
    return holders


def _choose_task(
    rng: random.Random, task_type: str, scene: Scene, constants: Any, holders: dict[str, list[str]]
) -> dict[str, str] | None:
    present = {scene.receptacle_class(r) for r in scene.receptacles}
    objects = [o for o in scene.object_classes if o in holders and set(holders[o]) & present]
    if task_type == "look_at_obj_in_light":
        lamps = [lamp for lamp in LAMPS if lamp in scene.object_classes]
        if not lamps or not objects or not present & set(_LAMP_HOLDERS):
            return None
        return {"object_target": rng.choice(objects), "parent_target": "", "toggle_target": rng.choice(lamps)}
    tool = _TOOL_RECEPTACLE.get(task_type)
    if tool is not None:
        if tool not in present:
            return None
        objects = [o for o in objects if o in constants.VAL_ACTION_OBJECTS[_TOOL_FLAG[task_type]]]
    rng.shuffle(objects)
    for obj in objects:
        parents = sorted(set(holders[obj]) & present - {tool} - set(constants.MOVABLE_RECEPTACLES))
        if parents:
            return {"object_target": obj, "parent_target": rng.choice(parents), "toggle_target": ""}
    return None


def generate_game(seed: int, task_type: str, scene_number: int) -> GeneratedGame | None:
    """Build one game of `task_type` in a floor plan, or None when that scene cannot host the task."""
    from alfworld.agents.utils.misc import add_task_to_grammar
    from alfworld.gen import constants, goal_library

    rng = random.Random(f"{seed}/{task_type}/{scene_number}")
    scene = load_scene(scene_number)
    holders = _placeable(constants)
    task = _choose_task(rng, task_type, scene, constants, holders)
    if task is None:
        return None
    target, parent, toggle = task["object_target"], task["parent_target"], task["toggle_target"]
    receptacles_by_class: dict[str, list[str]] = {}
    for rid in scene.receptacles:
        receptacles_by_class.setdefault(scene.receptacle_class(rid), []).append(rid)

    classes = [
        o for o in scene.object_classes if o in holders and set(holders[o]) & set(receptacles_by_class) and o != target
    ]
    rng.shuffle(classes)
    classes = [target] + classes[: MAX_OBJECT_CLASSES - 1]
    placements: list[tuple[str, str, str]] = []  # (object class, object id, receptacle id)
    for obj in classes:
        count = (
            rng.randint(2, MAX_INSTANCES)
            if obj == target and task_type == "pick_two_obj_and_place"
            else rng.randint(1, 2)
        )
        # the target must not start where it has to end up, or the task would be solved already
        options = [
            r
            for rc in holders[obj]
            if rc in receptacles_by_class and not (obj == target and rc == parent)
            for r in receptacles_by_class[rc]
        ]
        if not options:
            if obj == target:
                return None
            continue
        for _ in range(count):
            coords = "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))
            placements.append((obj, f"{obj}|{coords}", rng.choice(options)))
    if toggle:
        holders_here = [r for rc in _LAMP_HOLDERS for r in receptacles_by_class.get(rc, [])]
        placements.append(
            (
                toggle,
                f"{toggle}|{rng.uniform(-3, 3):+06.2f}|+01.00|{rng.uniform(-3, 3):+06.2f}",
                rng.choice(holders_here),
            )
        )

    problem = _problem(scene, placements, task_type, task, constants, goal_library)
    params = {
        "object_target": target,
        "parent_target": parent,
        "toggle_target": toggle,
        "mrecep_target": "",
        "object_sliced": False,
    }
    root = _alfworld_root() / "data"
    traj_stub = {"task_type": task_type, "pddl_params": params}
    template_rng = random.Random(rng.random())
    state = random.getstate()
    random.seed(template_rng.random())  # goal_library's template choice uses the global `random`
    try:
        grammar = add_task_to_grammar((root / "alfred.twl2").read_text(), traj_stub)
    finally:
        random.setstate(state)
    description = (
        grammar.split("Your task is to: ", 1)[1].split('"', 1)[0].rstrip(".") if "Your task is to: " in grammar else ""
    )
    game = GeneratedGame(task_type, scene_number, params, description)
    game.game_data = {
        "pddl_domain": (root / "alfred.pddl").read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": True,
        "generated_by": "agent-runtime",
    }
    return game


def _location(pose: tuple[float, float, int, int]) -> str:
    x, z, rotation, horizon = pose
    return mangle(f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{rotation // 90 % 4}|{horizon}")


def _problem(
    scene: Scene,
    placements: list[tuple[str, str, str]],
    task_type: str,
    task: dict[str, str],
    constants: Any,
    goal_library: Any,
) -> str:
    rtypes = sorted(constants.RECEPTACLES - set(constants.MOVABLE_RECEPTACLES))
    otypes = sorted(set(constants.OBJECTS) - set(rtypes))
    locations = {rid: _location(pose) for rid, pose in scene.receptacles.items()}
    start = "loc_bar_start"
    facts = [f"(atLocation agent1 {start})"]
    receptacle_classes = set()
    for rid, loc in locations.items():
        rclass = scene.receptacle_class(rid)
        receptacle_classes.add(rclass)
        facts.append(f"(receptacleType {mangle(rid)} {rclass}Type)")
        facts.append(f"(receptacleAtLocation {mangle(rid)} {loc})")
        if rclass in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {mangle(rid)})")
    object_classes = set()
    flags = {"Cleanable": "cleanable", "Heatable": "heatable", "Coolable": "coolable", "Toggleable": "toggleable"}
    for obj, oid, rid in placements:
        name = mangle(oid)
        object_classes.add(obj)
        facts += [
            f"(objectType {name} {obj}Type)",
            f"(inReceptacle {name} {mangle(rid)})",
            f"(objectAtLocation {name} {locations[rid]})",
        ]
        if obj not in LAMPS:
            facts.append(f"(pickupable {name})")
        if obj in constants.MOVABLE_RECEPTACLES:
            facts.append(f"(isReceptacleObject {name})")
        facts += [f"({flag} {name})" for key, flag in flags.items() if obj in constants.VAL_ACTION_OBJECTS[key]]
    for rclass in sorted(receptacle_classes):
        for obj in sorted(object_classes & set(constants.VAL_RECEPTACLE_OBJECTS.get(rclass, ()))):
            facts.append(f"(canContain {rclass}Type {obj}Type)")
    objects = (
        ["agent1 - agent", f"{start} - location"]
        + [f"{t}Type - otype" for t in otypes]
        + [f"{t}Type - rtype" for t in rtypes]
        + sorted({f"{loc} - location" for loc in locations.values()})
        + [f"{mangle(rid)} - receptacle" for rid in locations]
        + [f"{mangle(oid)} - object" for _, oid, _ in placements]
    )
    goal = (
        goal_library.gdict[task_type]["pddl"]
        .format(obj=task["object_target"], recep=task["parent_target"], toggle=task["toggle_target"])
        .replace("#", "-")
    )
    return (
        "(define (problem alfworld_generated)\n(:domain alfred)\n(:objects\n  "
        + "\n  ".join(objects)
        + "\n)\n(:init\n  "
        + "\n  ".join(facts)
        + "\n)\n"
        + goal.strip()
        + "\n"
    )
