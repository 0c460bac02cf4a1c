"""The phases after PLAY, each given a `Run` and the backend it acts with, each committing its results with the run's
cursor move in one transaction: EXTRACT (`extract`: lessons from episodes, the gate, induced lessons), CONSOLIDATE
-> EVALUATE -> PROMOTE | ROLLBACK (`consolidate`: one OPCD cycle), and the adapter probe after a promotion
(`probe`). `decisions` rebuilds logged turns as prompts; `system_prompt` is the context of system-prompt
distillation. Nothing here imports the loop."""
