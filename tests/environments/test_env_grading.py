"""Math grading: `environments.math.is_correct` on tricky formats, wrong answers and code in the answer."""

from __future__ import annotations

import json
import threading

import pytest

from environments.math import extract_final_answer, is_correct
from tests import ROOT, TESTS

# answer/gold pairs shared with bench/grading.py, which times them
CASES = json.loads((TESTS / "data" / "grading_cases.json").read_text())
CORRECT = [tuple(pair) for pair in CASES["correct"]]
WRONG = [tuple(pair) for pair in CASES["wrong"]]


@pytest.mark.parametrize("response,gold", CORRECT)
def test_correct_answers(response, gold):
    assert is_correct(response, gold) is True


@pytest.mark.parametrize("response,gold", WRONG)
def test_wrong_answers(response, gold):
    assert is_correct(response, gold) is False


def test_enough_cases():
    assert len(CORRECT) + len(WRONG) >= 40


def test_code_in_the_answer_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    response = f"Answer: __import__('pathlib').Path({str(marker)!r}).touch()"
    assert is_correct(response, "0") is False
    assert not marker.exists()


def test_last_stated_answer_is_extracted():
    assert extract_final_answer("\\boxed{1} then #### 2 and finally Answer: 3") == "3"
    assert extract_final_answer("#### 7\n\\boxed{8}") == "8"
    assert extract_final_answer("   \n ") is None


def test_grading_works_off_the_main_thread():
    """math-verify's SIGALRM timeout refuses non-main threads; rollout workers grade from threads."""
    results: list[bool] = []
    errors: list[Exception] = []

    def grade() -> None:
        try:
            results.extend([is_correct("\\boxed{\\frac{1}{2}}", "0.5"), is_correct("\\boxed{3}", "4")])
        except Exception as exc:  # noqa: BLE001 - the failure we guard against
            errors.append(exc)

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join(timeout=60)
    assert errors == [] and results == [True, False]


HUGE = [
    "\\boxed{9^{9^{9}}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{1000000!}",
    "\\boxed{(10!)!}",
    "\\boxed{\\binom{10^{7}}{5000000}}",
    "\\boxed{\\prod_{i=1}^{1000000} i}",
    "\\boxed{9^{-999999}}",
]


def test_huge_numbers_are_graded_at_once_in_any_thread():
    """`9^{9^{9}}` graded off the main thread held the GIL for minutes (math-verify's timeout is a SIGALRM,
    main thread only, and no signal interrupts a big-integer power): run in a child so a regression fails."""
    import subprocess
    import sys

    script = (
        "import sys, threading, time\n"
        "from environments.math import is_correct\n"
        "is_correct('\\\\boxed{1}', '1')\n"
        f"answers = {HUGE!r}\n"
        "out = []\n"
        "start = time.perf_counter()\n"
        "worker = threading.Thread(target=lambda: out.extend(is_correct(a, '18') for a in answers))\n"
        "worker.start(); worker.join()\n"
        "out.append(is_correct(answers[0], '9^{9^{9}}'))\n"
        "print(time.perf_counter() - start, out)\n"
    )
    repo = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, cwd=repo, check=True
    )
    seconds, results = done.stdout.split(" ", 1)
    assert results.strip() == str([False] * len(HUGE) + [True])
    assert float(seconds) < 1.0


def test_a_grade_past_the_deadline_is_wrong_and_the_next_grade_works(monkeypatch):
    """What the size estimate lets through is bounded by killing the grading process."""
    import time

    from environments.math import grading

    monkeypatch.setattr(grading, "oversized", lambda latex: None)
    monkeypatch.setattr(grading, "DEADLINE_SECONDS", 1.0)
    assert is_correct("\\boxed{3}", "3")  # the grading process is up
    results: list[bool] = []
    start = time.perf_counter()
    worker = threading.Thread(target=lambda: results.append(is_correct("\\boxed{9^{9^{9}}}", "18")))
    worker.start()
    worker.join(timeout=30)
    assert results == [False] and time.perf_counter() - start < 5
    assert is_correct("\\boxed{\\frac{1}{2}}", "0.5") and not is_correct("\\boxed{3}", "4")


@pytest.mark.parametrize(
    "latex,too_big",
    [
        ("e^{x^2}", False),
        ("2^{1000}", False),
        ("2^{2^{2^{2^{2}}}}", False),
        ("\\binom{1000}{500}", False),
        ("\\sum_{i=1}^{100} i", False),
        ("(n+1)^{n-1}", False),
        ("[1, 3)", False),
        ("10^{100}", False),
        ("9^{9^{9}}", True),
        ("\\sin(9^{9^{9}})", True),
        ("[1, 3) + 9^{999999}", True),
        ("30000!", True),
        ("\\sqrt[3]{10^{10^{10}}}", True),
        ("\\sum_{k=0}^{10^{9}} k", True),
    ],
)
def test_size_estimate(latex, too_big):
    from environments.math.bounds import oversized

    assert (oversized(latex) is not None) is too_big


def test_a_grading_process_that_cannot_start_is_a_clear_error(monkeypatch, tmp_path):
    """A broken installation is not "every answer is wrong": the first grade says why."""
    from environments.base import EnvError
    from environments.math import grading

    (tmp_path / "math_verify.py").write_text("raise ImportError('math-verify is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    grading._GradingProcess._stop()  # the next grade starts a new grading process, with that PYTHONPATH
    with pytest.raises(EnvError, match="(?s)exited at start .*math-verify is broken here"):
        is_correct("\\boxed{3}", "3")
    monkeypatch.undo()
    assert is_correct("\\boxed{3}", "3")
