"""Math environments (one-step episodes: the observation is a problem, the action the whole answer)
and their grader, `is_correct(response, gold)`."""

from environments.math.grading import extract_final_answer, is_correct

__all__ = ["extract_final_answer", "is_correct"]
