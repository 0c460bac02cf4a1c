"""The learning table: what a run's newest OPCD cycle measured, in the form a person reads in ten seconds.

Every cycle evaluates, on the same held-out tasks with the same seeds, a random admissible player, the parent
policy (the base model at the first cycle) without and with the live lessons, and the new adapter without
lessons (see `agent_runtime.phases.consolidate`). This module reads those evaluation rows back and prints one line
per condition with its success rate, Wilson 95% interval and number of tasks, plus the paired comparison with
the parent without lessons (task by task: the difference and an exact McNemar p-value). The last two rows are
the promotion decision's own games (the validation fold, or the train split of a run made before it; without
lessons), not held-out. `agent-runtime run` prints it
at the end of a run that completed a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from distill.lessons.gate import mcnemar_p
from memory import ExperienceStore
from memory.conditions import REFERENCE, condition_labels
from memory.intervals import wilson_interval


@dataclass
class Condition:
    name: str
    outcomes: dict[tuple, bool]  # (env, task, seed) -> won
    split: str = "eval"  # the fold its games came from

    @property
    def wins(self) -> int:
        return sum(self.outcomes.values())

    @property
    def n(self) -> int:
        return len(self.outcomes)


def cycle_conditions(store: ExperienceStore, run_id: int, cycle_id: int) -> dict[str, Condition]:
    """Each evaluated condition of a cycle, pooled over its environments, keyed by task for pairing."""
    out: dict[str, Condition] = {}
    for row in store.evaluations(run_id, cycle_id=cycle_id):
        name = (row.metrics or {}).get("condition")
        if not name:
            continue
        condition = out.setdefault(name, Condition(name, {}, row.split or "eval"))
        for episode in row.metrics.get("episodes", []):
            condition.outcomes[(row.env_id, episode["task_id"], episode["seed"])] = bool(episode["won"])
    return out


def learning_table(store: ExperienceStore, run_id: int) -> str | None:
    """The newest evaluated cycle of the run as a text table; None when no cycle was evaluated."""
    cycles = [c for c in store.cycles(run_id) if (c.metrics or {}).get("evaluation")]
    if not cycles:
        return None
    cycle = cycles[-1]
    conditions = cycle_conditions(store, run_id, cycle.id)
    # the teacher rows are the cycle's parent: the base model at the first cycle, the live adapter later
    parent = "base model" if cycle.base_adapter_id is None else "parent adapter"
    split = next((c.split for n, c in conditions.items() if n.startswith("validation")), "validation")
    labels = condition_labels(parent, split)
    lines = [f"Held-out success after OPCD cycle {cycle.id} ({cycle.status}); same tasks and seeds in every row:"]
    width = max((len(label) for name, label in labels.items() if conditions.get(name)), default=0)
    for name, label in labels.items():
        condition = conditions.get(name)
        if condition is None or condition.n == 0:
            continue
        lo, hi = wilson_interval(condition.wins, condition.n)
        line = (
            f"  {label:<{width}} {condition.wins:>3}/{condition.n:<3} {condition.wins / condition.n:6.1%} "
            f"[95% CI {lo:.0%}-{hi:.0%}]"
        )
        reference = conditions.get(REFERENCE.get(name, ""))
        if reference is not None:
            keys = sorted(set(condition.outcomes) & set(reference.outcomes))
            a, b = [reference.outcomes[k] for k in keys], [condition.outcomes[k] for k in keys]
            if keys:
                line += (
                    f"  {(sum(b) - sum(a)) / len(keys):+.0%} vs {labels[REFERENCE[name]]} "
                    f"(paired, McNemar p={mcnemar_p(a, b):.2g})"
                )
        lines.append(line)
    kl = (cycle.metrics or {}).get("heldout_kl")
    if kl:
        lines.append(f"  held-out KL(student || teacher with lessons): {kl['before']:.4f} -> {kl['after']:.4f}")
    return "\n".join(lines)
