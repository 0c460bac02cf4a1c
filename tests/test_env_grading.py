"""Math grading: `environments.math.is_correct` on tricky formats, wrong answers and code in the answer."""

from __future__ import annotations

import threading

import pytest

from environments.math import extract_final_answer, is_correct

CORRECT = [
    ("The answer is \\boxed{18}.", "18"),
    ("#### 18", "18"),
    ("She pays 3*6 = 18 dollars.\n#### 18", "#### 18"),
    ("Answer: 18", "18"),
    ("answer: 18", "18"),
    ("The final answer is 18.", "18"),
    ("The final answer is $\\boxed{18}$. I hope it is correct.", "18"),
    ("Final Answer: The final answer is $18$.", "18"),
    ("So the answer is 18 dollars.", "18"),
    ("Answer: $18", "18"),
    ("\\boxed{\\$18}", "18"),
    ("\\boxed{1,000}", "1000"),
    ("Answer: 1,000,000", "1000000"),
    ("\\boxed{18.0}", "18"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{2(x+1)}", "2x+2"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{x = 5}", "5"),
    ("x = 5", "5"),
    ("\\boxed{(1, 2)}", "(1,2)"),
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
    ("\\boxed{[1, 3)}", "[1,3)"),
    ("\\boxed{\\pi}", "\\pi"),
    ("\\boxed{2\\pi}", "2 \\pi"),
    ("\\boxed{10\\%}", "10\\%"),
    ("First I thought \\boxed{17}, but rechecking, the answer is \\boxed{18}.", "18"),
    ("\\boxed{17}\nWait, that's wrong.\nAnswer: 18", "18"),
    ("18", "18"),
    ("Lots of reasoning...\n\n18", "18"),
    ("\\boxed{\\boxed{18}}", "18"),
    ("The answer is: \\boxed{\\frac{7}{2}}", "3.5"),
    ("\\fbox{42}", "42"),
    ("Answer: \\boxed{3}", "There are 3 apples.\n#### 3"),
    ("\\boxed{(n+1)^{n-1}}", "(n+1)^(n-1)"),
]

WRONG = [
    ("The answer is \\boxed{17}.", "18"),
    ("#### 19", "18"),
    ("\\boxed{18} ... no, actually \\boxed{19}", "18"),
    ("Answer: 18\nOn second thought, the final answer is 20.", "18"),
    ("\\boxed{(1, 2)}", "(2,1)"),
    ("\\boxed{[1, 3)}", "(1,3)"),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{1,2\\}"),
    ("\\boxed{x = 6}", "5"),
    ("\\boxed{0.33}", "\\frac{1}{3}"),
    ("", "18"),
    ("I don't know.", "18"),
    ("\\boxed{}", "18"),
    ("\\boxed{18", "19"),
    ("__import__('os').system('touch /tmp/pwned_by_grader')", "0"),
    ("Answer: eval(\"1+1\")", "2"),
    ("```python\nprint(18)\n```", "18"),
    ("\\boxed{" + "9" * 5000 + "}", "9"),
    ("Answer: " + "(" * 300 + "1" + ")" * 300, "2"),
]


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
