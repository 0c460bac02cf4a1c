"""`StrictConfig`: the one base class of every config section in the project.

Unknown keys are errors (a typo in a YAML file must not be silently ignored) and assignments are validated
(an override set after construction is checked like a loaded value). `agent_runtime.config` builds the run
config from these; the lessons and OPCD sections live here, in `distill`, so they use the same base without
`distill` importing `agent_runtime`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
