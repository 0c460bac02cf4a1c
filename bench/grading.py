"""Benchmark of math grading time: adversarial answers in the main thread and in a worker thread, and the
cost of ordinary answers. Prints markdown tables.

Why: math-verify's own timeout is a SIGALRM, which works only on the main thread, and a big-integer power
such as `\\boxed{9^{9^{9}}}` runs inside one C call that no signal interrupts; rollout workers grade from
threads. Each adversarial case runs in a fresh interpreter under a hard wall-clock cap (`--cap`, killed
beyond it), so a grade that holds the GIL for minutes costs the bench only the cap. Ordinary answers are
the cases of tests/environments/test_env_grading.py (kept in tests/data/grading_cases.json; each must grade as the test
says), graded in one process after a warm-up grade, on the main thread and on a worker thread.

Usage: `python bench/grading.py [--cap 30] [--repeat 3] [--root OTHER_CHECKOUT]` (`--root` measures the
grader of another checkout, e.g. `git worktree add /tmp/before HEAD~1`, against this one's test cases).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    ROOT / "tests" / "data" / "grading_cases.json"
)  # the answer/gold pairs of tests/environments/test_env_grading.py

ADVERSARIAL = [
    ("\\boxed{9^{9^{9}}}", "18"),
    ("\\boxed{10^{10^{10}}}", "18"),
    ("\\boxed{9^9^9}", "18"),
    ("\\boxed{9^{999999}}", "18"),
    ("\\boxed{2^{2^{2^{2^{2}}}}}", "18"),
    ("\\boxed{1000000!}", "18"),
    ("\\boxed{(10!)!}", "18"),
    ("\\boxed{\\binom{10^{7}}{5000000}}", "18"),
    ("\\boxed{\\prod_{i=1}^{1000000} i}", "18"),
    ("\\boxed{(x+1)^{100000}}", "x"),
    ("\\boxed{(1+\\sqrt{2})^{99999}}", "18"),
    ("\\boxed{(x+y)^{3000}}", "18"),
]

_ADVERSARIAL = """
import sys, threading, time
sys.path.insert(0, {root!r})
from environments.math import is_correct
is_correct("\\\\boxed{{1}}", "1")
answer, gold, mode = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if mode == "main":
    result = is_correct(answer, gold)
else:
    out = []
    worker = threading.Thread(target=lambda: out.append(is_correct(answer, gold)))
    worker.start()
    worker.join()
    result = out[0]
print(f"{{time.perf_counter() - start:.3f}} {{result}}")
"""

_ORDINARY = """
import json, statistics, sys, threading, time
sys.path.insert(0, {here!r})
sys.path.insert(0, {root!r})
from environments.math import is_correct
CASES = json.loads(open({cases!r}).read())
CORRECT, WRONG = [tuple(c) for c in CASES["correct"]], [tuple(w) for w in CASES["wrong"]]
is_correct("\\\\boxed{{1}}", "1")
mode, repeat = sys.argv[1], int(sys.argv[2])
times = []
def run():
    for answer, gold in CORRECT + WRONG:
        start = time.perf_counter()
        got = is_correct(answer, gold)
        times.append(time.perf_counter() - start)
        assert got == ((answer, gold) in CORRECT), (answer, gold)
for _ in range(repeat):
    if mode == "main":
        run()
    else:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
print(json.dumps([statistics.median(times) * 1000, statistics.mean(times) * 1000, max(times) * 1000]))
"""


def _run(code: str, args: list[str], cap: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=cap, check=False
        )
    except subprocess.TimeoutExpired:
        return None


def _adversarial(root: str, answer: str, gold: str, mode: str, cap: float) -> str:
    done = _run(_ADVERSARIAL.format(root=root), [answer, gold, mode], cap)
    if done is None:
        return f"> {cap:.0f} s (killed)"
    if done.returncode != 0:
        return f"error: {done.stderr.strip().splitlines()[-1][:60]}"
    seconds, result = done.stdout.split()[-2:]
    return f"{float(seconds):.3f} s ({result})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=30.0, help="seconds before an adversarial grade is killed")
    parser.add_argument("--repeat", type=int, default=3, help="passes over the ordinary answers")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose grader is measured (e.g. an older one)")
    args = parser.parse_args()
    print("| answer | gold | main thread | worker thread |")
    print("|---|---|---:|---:|")
    for answer, gold in ADVERSARIAL:
        main_t = _adversarial(args.root, answer, gold, "main", args.cap)
        thread_t = _adversarial(args.root, answer, gold, "thread", args.cap)
        print(f"| `{answer}` | `{gold}` | {main_t} | {thread_t} |", flush=True)
    print()
    print("| ordinary answers (tests/environments/test_env_grading.py) | median ms | mean ms | max ms |")
    print("|---|---:|---:|---:|")
    for mode, label in (("main", "main thread"), ("thread", "worker thread")):
        script = _ORDINARY.format(root=args.root, here=str(ROOT), cases=str(CASES))
        done = _run(script, [mode, str(args.repeat)], 600)
        assert done is not None and done.returncode == 0, done and done.stderr[-2000:]
        median, mean, worst = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {label} | {median:.2f} | {mean:.2f} | {worst:.0f} |")


if __name__ == "__main__":
    main()
