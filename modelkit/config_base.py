"""`StrictConfig`: the one base class of every config section in the project.

Unknown keys are errors (a typo in a YAML file must not be silently ignored) and assignments are validated
(an override set after construction is checked like a loaded value). `agent_runtime.config` builds the run
config from these; the lessons and OPCD sections live in `distill` and the backends' options in `agent_runtime.llm`,
all on this one base in the ground floor, so that neither imports the other for it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
