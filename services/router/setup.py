"""Builds the router's wire modules as C extensions with Cython (pure-Python mode).

The modules named in :data:`COMPILED` are plain Python that Cython also
compiles: their classes are declared with ``cython.cclass`` and
``cython.declare``, so compiled, their attributes are C struct fields and
their methods C functions (docs/benchmarks.md: what it saves per request).
Uncompiled, the same source runs as ordinary Python; that is what a build
gets with ``LLMGW_PURE_PYTHON=1`` or where no C compiler is found (with a
warning), and the router logs which it runs at startup.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = ("upstream_wire", "frontconn", "frontwire", "upstream", "tokens", "affinity", "frontrules")


def extensions() -> list:
    if os.environ.get("LLMGW_PURE_PYTHON"):
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:  # a build environment without Cython (pyproject.toml asks for it)
        print("llmgw-router: Cython is missing; building the pure-Python router", file=sys.stderr)
        return []
    modules = [Extension(f"llmgw.router.{name}", [f"src/llmgw/router/{name}.py"]) for name in COMPILED]
    # annotation_typing off: the modules' annotations are for mypy; the C types are the declare()s.
    directives = {"language_level": 3, "annotation_typing": False}
    return cythonize(modules, compiler_directives=directives, quiet=True)


class OptionalBuildExt(build_ext):
    """A module that fails to compile (no C compiler here) stays pure Python, with a warning."""

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as err:  # the compiler's errors have no common base
            print(f"llmgw-router: {ext.name} not compiled ({err}); it runs as pure Python", file=sys.stderr)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
