"""Questions with a fixed set of answers (one-step episodes): `qa/medmcqa` (four lettered options) and
`qa/safety` (yes or no), the evaluation sets of the OPCD paper's system-prompt distillation.

The observation is the question, the action the whole reply, and the reply is graded on the option it states
last (`chosen_label`); the data comes from a local file or the `datasets` library (`environments.qa.sources`).
"""

from environments.qa.choice import ChoiceEnv, chosen_label

__all__ = ["ChoiceEnv", "chosen_label"]
