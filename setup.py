"""Package discovery: every sub-package under the repository root ships as metricsearch.*; tests and bench do not.

The metadata lives in pyproject.toml. Only the package list is computed here, so that a new sub-package can never
be silently missing from the wheel; this file itself stays out of it.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

NOT_SHIPPED = ["tests", "tests.*", "bench", "bench.*", "build", "build.*"]


class BuildPy(build_py):
    """build_py that leaves this setup.py out of the root package."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        """The package's modules, less setup.py at the root."""
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("metricsearch", "setup")]


class EditableWheel(editable_wheel):
    """`pip install -e .` in strict mode unless another mode is asked for: a tree of links to the shipped files
    only, so that, as in the wheel, metricsearch.tests and metricsearch.bench do not exist (the root is the package,
    and a lenient install would make every folder under it importable). A new module needs `pip install -e .` again."""

    def finalize_options(self) -> None:
        """Default the mode to strict."""
        self.mode = self.mode or "strict"
        super().finalize_options()


setup(packages=["metricsearch"] + [f"metricsearch.{name}" for name in find_packages(".", exclude=NOT_SHIPPED)],
      cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
