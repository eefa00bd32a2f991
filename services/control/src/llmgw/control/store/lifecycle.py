"""What the leader keeps in etcd about model versions: eval results and rollouts.

- ``evals/<model>/<version>``: one :class:`EvalResult`, the verdict of the
  model's eval gate on that version (ModelSpec.version, a hash of the weights
  and profiles) with the weights' revision, score and reason. Written once per
  version: a version that passed is published, one that failed stays
  unpublished until the document changes (a new version) or the operator
  clears the result by changing the gate (suite or min_score: results name
  them and a result for another gate does not count).
- ``rollouts/<model>``: one :class:`Rollout`, the model's last change of
  version: the version it moves to, the one it moves from with that version's
  whole document (so a rollback can place replicas of it again), and its
  state: rolling, done, or rolled_back with the reason.

Both are read at the start of a term (:meth:`LifecycleBook.load`) and written
through with leader-guarded transactions, like the replica records; what
does not parse is skipped with a warning. Neither grows without bound: the
leader deletes what no longer matters (:meth:`LifecycleBook.forget`, see
leader.lifecycle). Single event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Literal

from llmgw.common.etcd import Delete, Put, Store, batches

from ..spec.model import ModelSpec
from .replicas import GuardedWriter

EVALS_PREFIX = "evals/"
ROLLOUTS_PREFIX = "rollouts/"

log = logging.getLogger("llmgw.control.store.lifecycle")

RolloutState = Literal["rolling", "done", "rolled_back"]


@dataclass(frozen=True)
class EvalResult:
    model: str
    version: str
    # The weights' revision and source when it was judged.
    revision: str
    source: str
    suite: str
    min_score: float
    score: float
    passed: bool
    # Why it failed (or what was measured), in words for operators.
    reason: str
    replica: str
    at: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EvalResult:
        try:
            d = json.loads(data)
            return cls(
                model=str(d["model"]),
                version=str(d["version"]),
                revision=str(d.get("revision", "")),
                source=str(d.get("source", "")),
                suite=str(d["suite"]),
                min_score=float(d["min_score"]),
                score=float(d["score"]),
                passed=bool(d["passed"]),
                reason=str(d.get("reason", "")),
                replica=str(d.get("replica", "")),
                at=float(d.get("at", 0.0)),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not an eval result: {err}") from None

    def describe(self) -> str:
        verdict = "passed" if self.passed else "failed"
        on = f"{self.revision} ({self.version})" if self.revision else self.version
        line = f"{verdict}: score {self.score:.3g} (min {self.min_score:g}, suite {self.suite}) on {on}"
        return line + (f"; {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Rollout:
    model: str
    target: str
    previous: str
    # The previous version's whole document (JSON), when known: a rollback places it again.
    previous_spec: str
    state: RolloutState
    reason: str
    started: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Rollout:
        try:
            d = json.loads(data)
            state = d["state"]
            if state not in ("rolling", "done", "rolled_back"):
                raise ValueError(f"unknown state {state!r}")
            return cls(
                model=str(d["model"]),
                target=str(d["target"]),
                previous=str(d.get("previous", "")),
                previous_spec=str(d.get("previous_spec", "")),
                state=state,
                reason=str(d.get("reason", "")),
                started=float(d.get("started", 0.0)),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a rollout: {err}") from None

    def previous_document(self) -> ModelSpec | None:
        """The version rolled back to, or None when it is not known (or no longer validates)."""
        if not self.previous_spec:
            return None
        try:
            return ModelSpec.model_validate_json(self.previous_spec)
        except ValueError as err:
            log.warning("rollout of %s: the previous document does not validate: %s", self.model, err)
            return None


class LifecycleBook:
    """The leader's copy of ``evals/`` and ``rollouts/``, written through."""

    def __init__(self, store: Store, writer: GuardedWriter):
        self._store = store
        self._writer = writer
        self._evals: dict[tuple[str, str], EvalResult] = {}
        self._rollouts: dict[str, Rollout] = {}

    @property
    def rollouts(self) -> Mapping[str, Rollout]:
        return self._rollouts

    def result(self, model: str, version: str) -> EvalResult | None:
        return self._evals.get((model, version))

    async def load(self) -> None:
        evals: dict[tuple[str, str], EvalResult] = {}
        for entry in (await self._store.range(EVALS_PREFIX)).entries:
            try:
                r = EvalResult.from_json(entry.value)
            except ValueError as err:
                log.warning("skipping %s: %s", entry.key, err)
                continue
            evals[(r.model, r.version)] = r
        rollouts: dict[str, Rollout] = {}
        for entry in (await self._store.range(ROLLOUTS_PREFIX)).entries:
            try:
                ro = Rollout.from_json(entry.value)
            except ValueError as err:
                log.warning("skipping %s: %s", entry.key, err)
                continue
            rollouts[ro.model] = ro
        self._evals, self._rollouts = evals, rollouts

    async def record(self, result: EvalResult) -> None:
        await self._writer.commit([Put(f"{EVALS_PREFIX}{result.model}/{result.version}", result.to_json())])
        self._evals[(result.model, result.version)] = result

    async def forget(self, evals: Iterable[tuple[str, str]], rollouts: Iterable[str]) -> None:
        """Delete these results (model, version) and rollouts (model), in transactions etcd takes.

        The copy forgets what etcd deleted, piece by piece: a failure part way leaves the rest
        in both, for the next pass.
        """
        for batch in batches(list(evals)):
            await self._writer.commit(
                [Delete(f"{EVALS_PREFIX}{model}/{version}") for model, version in batch]
            )
            for key in batch:
                self._evals.pop(key, None)
        for models in batches(list(rollouts)):
            await self._writer.commit([Delete(ROLLOUTS_PREFIX + model) for model in models])
            for model in models:
                self._rollouts.pop(model, None)

    @property
    def evals(self) -> Mapping[tuple[str, str], EvalResult]:
        return self._evals

    async def put_rollout(self, rollout: Rollout) -> None:
        await self._writer.commit([Put(ROLLOUTS_PREFIX + rollout.model, rollout.to_json())])
        self._rollouts[rollout.model] = rollout

    async def set_state(self, model: str, state: RolloutState, reason: str) -> Rollout | None:
        ro = self._rollouts.get(model)
        if ro is None or (ro.state == state and ro.reason == reason):
            return ro
        ro = replace(ro, state=state, reason=reason)
        await self.put_rollout(ro)
        return ro

    def clear(self) -> None:
        self._evals, self._rollouts = {}, {}
