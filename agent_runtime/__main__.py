"""`python -m agent_runtime` is the `agent-runtime` command.

`python -m` puts the working directory first on `sys.path`, so a `yaml.py` or a `langchain_x.py` lying there would
be imported in place of the installed package, and run. The entry is removed before the command imports anything:
the runtime and the code a config names come from installed distributions (this project included: `make`
installs it, editable in a checkout), as under the `agent-runtime` console script, which puts only its own folder
there.
"""

import os
import sys

if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.realpath(os.getcwd()):
    del sys.path[0]

from agent_runtime.cli import main

raise SystemExit(main())
