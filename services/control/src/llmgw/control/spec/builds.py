"""Engine builds: which of a node's builds of an engine a profile may run on.

A node reports each engine build it has (kind, version, the program it runs,
the CUDA version it was built for) and its driver's CUDA version (agent
``Register``). A profile may require a version range of its engine
(``engine_version: ">=0.8,<0.9"``, a PEP 440 specifier set read by
``packaging.specifiers``). A build *matches* a profile when

- it is of the profile's engine kind;
- its version is in the range, when the profile gives one (pre-releases
  count: a range is what the operator wrote, and a node with only
  ``0.9.0rc1`` is asked for by writing ``>=0.9.0rc1``); a version that is not
  PEP 440 (llama.cpp's ``b4567``) matches no range;
- it was not built for a newer CUDA than the node's driver supports (a
  build for CUDA 12.8 fails to start on a 12.4 driver), when both are known.

Among the matching builds of a node, the node's main build (the agent's
``engines.<kind>``) is used when it matches: an extra build an operator
installs beside it (a candidate version) runs only what asks for it by a
range the main build is outside. Otherwise the newest matching version
(then the build name, for the same answer every time). Each mismatch is a reason
worded for an operator, which placement shows per node (``llmgw explain``).
Pure: no clock, no I/O; decide.placement calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

MAX_RANGE_CHARS = 128


class Build(Protocol):
    """One build as the inventory holds it (state.inventory.Engine)."""

    @property
    def kind(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def build(self) -> str: ...
    @property
    def cuda(self) -> str: ...


def parse_range(text: str) -> SpecifierSet:
    """A profile's ``engine_version`` as a specifier set, or ValueError saying what one looks like."""
    if len(text) > MAX_RANGE_CHARS:
        raise ValueError(f"engine_version is longer than {MAX_RANGE_CHARS} characters")
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(
            f"engine_version {text!r} is not a version range: write PEP 440 specifiers such as "
            "'>=0.8,<0.9' or '==0.8.5'"
        ) from None
    if not len(spec):
        raise ValueError("engine_version is empty; leave it out to allow any version")
    return spec


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _cuda(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in text.split(".")) if text else None
    except ValueError:
        return None


def mismatch(build: Build, versions: SpecifierSet | None, driver_cuda: str) -> str:
    """Why ``build`` cannot run a profile wanting ``versions`` on a ``driver_cuda`` driver; "" if it can."""
    name = f"{build.kind} {build.version or '(no version)'}" + (f" [{build.build}]" if build.build else "")
    if versions is not None:
        v = _version(build.version)
        if v is None:
            return f"{name} is not a PEP 440 version, so not in {versions}"
        if not versions.contains(v, prereleases=True):
            return f"{name} is outside {versions}"
    need, have = _cuda(build.cuda), _cuda(driver_cuda)
    if need is not None and have is not None and need > have:
        return f"{name} is built for CUDA {build.cuda}, the driver supports CUDA {driver_cuda}"
    return ""


def choose_build(
    builds: Sequence[Build], kind: str, versions: SpecifierSet | None, driver_cuda: str
) -> Build | str:
    """The main build of ``kind`` if it matches, else the newest that does, else why none does."""
    ok: list[Build] = []
    why: list[str] = []
    for b in builds:
        if b.kind != kind:
            continue
        problem = mismatch(b, versions, driver_cuda)
        if problem:
            why.append(problem)
        else:
            ok.append(b)
    main = next((b for b in ok if not b.build), None)
    if main is not None:
        return main
    if ok:
        return max(ok, key=lambda b: (_version(b.version) or Version("0"), b.build))
    return f"no build of {kind} matches: " + "; ".join(why)
