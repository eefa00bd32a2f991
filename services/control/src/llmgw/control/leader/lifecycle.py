"""The leader's duties for model versions: eval gates and the state of rolling updates.

The controller asks this object, on every pass:

- :meth:`Lifecycle.effective`: the catalog to plan with. A model whose
  rollout was rolled back is planned with its previous document (kept in
  the rollout), so decide.rollout moves the fleet back to it; the declared
  catalog is unchanged and routers see no difference.
- :meth:`Lifecycle.gated`: replicas the eval gate holds back. A replica of a
  model with ``eval_gate`` is withheld from the routers' table until its
  version has a passing result for that gate (suite and min_score) in etcd,
  unless it is published already (a version that serves keeps serving: an
  eval gate added to a running model does not cut it off).
- :meth:`Lifecycle.after_pass`: records rollouts and their state (rolling,
  done, rolled back when a replica of the new version fails or the gate
  fails it), and starts an evaluation of each gated version that has a
  ready replica and no result. One evaluation per (model, version) at a
  time; an engine that could not be asked is tried again after
  ``RETRY_SECONDS``, nothing recorded.

Each evaluation is a task this object owns: :meth:`stop` cancels and awaits
them (the controller calls it when a term ends), and a finished one writes
its result through the leader guard, then wakes the controller.

Decisions:

- The gate judges a *version* (ModelSpec.version: weights and profiles), not
  a replica: one replica's pass publishes every replica of that version,
  and the result is kept with the weights' revision. A failure is kept too,
  so a failing version is not re-run on every pass; a new version, or a
  changed gate, is judged afresh.
- Results and rollouts are kept only while a version in play needs them
  (after each pass: the model's current version, its rollout's target and
  previous, any replica's, any under evaluation); a removed model's go
  too. So etcd holds a few entries per model, however often it changes, and
  a version that comes back after it was forgotten is judged again.
- The previous document of a model is captured when the catalog changes
  (every control plane sees the change, so a standby that leads later has
  it in memory, and it is written into the rollout as soon as a leader
  starts one). A rollout started by a leader that never saw the previous
  document cannot roll back; it says so and keeps rolling forward.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

import aiohttp

from llmgw.common.errors import InvalidArgument
from llmgw.common.keys import engine_key

from ..decide.reconcile import Action, NoteFailure, Replica
from ..decide.rollout import outdated
from ..spec.catalog import Catalog, Model
from ..spec.evalsuite import EvalSuite
from ..spec.model import ModelSpec
from ..store.lifecycle import EvalResult, LifecycleBook, Rollout
from .evaluator import EngineUnreachable, EvalFailed, run_suite

log = logging.getLogger("llmgw.control.leader.lifecycle")

RETRY_SECONDS = 5.0


class Lifecycle:
    def __init__(
        self,
        book: LifecycleBook,
        secret: bytes,
        wall: Callable[[], float],
        notify: Callable[[], None],
    ):
        self.book = book
        self._secret = secret
        self._wall = wall
        self._notify = notify
        # Each model's document before its last change of version (kept across terms).
        self._previous: dict[str, ModelSpec] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        # Why a gated version is not being evaluated (no suite of that name, say).
        self._waiting: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None
        # Each rolling model's replicas ready on the new version, as last logged.
        self._logged_progress: dict[str, int] = {}

    # -- catalog changes (every control plane) ---------------------------------

    def catalog_replaced(self, old: Catalog, new: Catalog) -> None:
        for name in [n for n in self._previous if new.get(n) is None]:
            del self._previous[name]  # a removed model's last document is nobody's to roll back to
        for m in new:
            before = old.get(m.name)
            if before is not None and before.spec is not None and before.version != m.version:
                self._previous[m.name] = before.spec

    # -- a term ---------------------------------------------------------------

    async def load(self) -> None:
        await self.book.load()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._retry_at.clear()
        self._waiting.clear()
        self.book.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- what a pass asks ------------------------------------------------------

    def effective(self, catalog: Catalog) -> Catalog:
        swaps: dict[str, Model] = {}
        for name, ro in self.book.rollouts.items():
            m = catalog.get(name)
            if m is None or ro.state != "rolled_back" or ro.target != m.version:
                continue
            spec = ro.previous_document()
            if spec is not None and spec.name == name:
                swaps[name] = Model.from_spec(spec, m.origin)
        if not swaps:
            return catalog
        try:
            return catalog.replaced(swaps)
        except InvalidArgument as err:  # the old document no longer fits the catalog (a name taken since)
            log.warning("cannot plan the rollback of %s: %s", ", ".join(sorted(swaps)), err)
            return catalog

    def gated(
        self, catalog: Catalog, replicas: Iterable[Replica], published: Container[str]
    ) -> frozenset[str]:
        out = set()
        for r in replicas:
            m = catalog.get(r.record.model)
            if m is None or m.spec is None or m.spec.eval_gate is None or r.id in published:
                continue
            if not self._passed(m, r.record.version or m.version):
                out.add(r.id)
        return frozenset(out)

    @staticmethod
    def replaced(catalog: Catalog, replicas: Iterable[Replica]) -> set[str]:
        """Replicas of another version than their model's: a rolling update replaces them."""
        out: set[str] = set()
        for r in replicas:
            m = catalog.get(r.record.model)
            if m is not None and outdated(m, [r]):
                out.add(r.id)
        return out

    def _passed(self, m: Model, version: str) -> bool:
        res = self._result(m, version)
        return res is not None and res.passed

    def _result(self, m: Model, version: str) -> EvalResult | None:
        """The result of the model's current gate on ``version``; a result of another gate does not count."""
        gate = m.spec.eval_gate if m.spec is not None else None
        res = self.book.result(m.name, version)
        if gate is None or res is None or res.suite != gate.suite or res.min_score != gate.min_score:
            return None
        return res

    async def after_pass(
        self,
        declared: Catalog,
        effective: Catalog,
        replicas: Sequence[Replica],
        actions: Sequence[Action],
        gated: Container[str],
        suites: Mapping[str, EvalSuite],
        now: float,
    ) -> None:
        failed = {a.replica_id: a.message for a in actions if isinstance(a, NoteFailure)}
        by_model: dict[str, list[Replica]] = {}
        for r in replicas:
            by_model.setdefault(r.record.model, []).append(r)
        for m in declared:
            if m.profiles and m.version:
                await self._follow_rollout(m, by_model.get(m.name, []), failed)
        await self._prune(declared, replicas)
        self._evaluate(effective, replicas, gated, suites, now)

    async def _prune(self, declared: Catalog, replicas: Sequence[Replica]) -> None:
        """Forget what no version in play needs: results of versions that are neither a model's
        current one, its rollout's two, nor a replica's, and everything of a model no longer
        declared (its rollout too). An evaluation in flight keeps its (model, version)."""
        kept: set[tuple[str, str]] = {(r.record.model, r.record.version) for r in replicas}
        kept.update(self._tasks)
        for m in declared:
            kept.add((m.name, m.version))
            ro = self.book.rollouts.get(m.name)
            if ro is not None:
                kept.update(((m.name, ro.target), (m.name, ro.previous)))
        evals = [key for key in self.book.evals if key not in kept]
        rollouts = [name for name in self.book.rollouts if declared.get(name) is None]
        if evals or rollouts:
            await self.book.forget(evals, rollouts)
            log.info(
                "forgot %d eval result(s) and %d rollout(s) no model version needs any more",
                len(evals),
                len(rollouts),
            )

    async def _follow_rollout(self, m: Model, mine: Sequence[Replica], failed: Mapping[str, str]) -> None:
        ro = self.book.rollouts.get(m.name)
        old = outdated(m, mine)
        if ro is None or ro.target != m.version:
            if not old:
                return
            previous = Counter(r.record.version for r in old).most_common(1)[0][0]
            spec = self._previous.get(m.name)
            doc = spec.model_dump_json() if spec is not None and spec.version == previous else ""
            if not doc and ro is not None and ro.previous == previous:
                doc = ro.previous_spec  # changed again after a rollback: back to the same version
            if not doc:
                log.warning(
                    "rolling update of %s: its previous document is unknown here; it cannot be rolled back",
                    m.name,
                )
            ro = Rollout(m.name, m.version, previous, doc, "rolling", "", self._wall())
            await self.book.put_rollout(ro)
            log.info("model %s: rolling update from %s to %s", m.name, previous, m.version)
            return
        if ro.state != "rolling":
            self._logged_progress.pop(m.name, None)
            return
        # Each step in the log: the one record of an update's pace that outlives it.
        new = sum(1 for r in mine if r.record.version == m.version and r.ready)
        if self._logged_progress.get(m.name) != new:
            self._logged_progress[m.name] = new
            log.info(
                "model %s: rolling update to %s: %d ready on the new version, %d old left",
                m.name,
                m.version,
                new,
                len(old),
            )
        bad = [
            f"replica {rid} of the new version failed: {msg}"
            for rid, msg in failed.items()
            if _of(mine, rid, m.version)
        ]
        res = self._result(m, m.version)
        if res is not None and not res.passed:
            bad.append(f"the eval gate failed it: {res.describe()}")
        if bad and ro.previous_spec:
            await self.book.set_state(m.name, "rolled_back", bad[0].splitlines()[0][:300])
            log.warning("model %s: rolling update rolled back: %s", m.name, bad[0])
            self._notify()
        elif not old and mine and all(r.ready for r in mine):
            await self.book.set_state(m.name, "done", "")
            log.info("model %s: rolling update to %s done", m.name, m.version)

    def _evaluate(
        self,
        catalog: Catalog,
        replicas: Sequence[Replica],
        gated: Container[str],
        suites: Mapping[str, EvalSuite],
        now: float,
    ) -> None:
        self._waiting = {}
        for r in sorted(replicas, key=lambda r: (r.record.created, r.id)):
            m = catalog.get(r.record.model)
            if r.id not in gated or m is None or m.spec is None or m.spec.eval_gate is None:
                continue
            version = r.record.version or m.version
            key = (m.name, version)
            if version != m.version or key in self._tasks or self._result(m, version) is not None:
                continue
            suite = suites.get(m.spec.eval_gate.suite)
            if suite is None:
                self._waiting[m.name] = (
                    f"suite {m.spec.eval_gate.suite!r} is not in the cluster settings' eval_suites; "
                    "the version waits unpublished"
                )
                continue
            if not r.ready or r.reported is None or not r.reported.url or self._retry_at.get(key, 0.0) > now:
                continue
            task = asyncio.create_task(self._run(m, version, r, suite, now), name=f"eval-{m.name}")
            self._tasks[key] = task

    async def _run(self, m: Model, version: str, r: Replica, suite: EvalSuite, now: float) -> None:
        assert m.spec is not None and m.spec.eval_gate is not None and r.reported is not None
        gate, key = m.spec.eval_gate, (m.name, version)
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            log.info("eval gate of %s: running suite %s against %s", m.name, gate.suite, r.id)
            try:
                score = await run_suite(
                    self._session,
                    r.reported.url,
                    engine_key(self._secret, r.id),
                    r.reported.served_name or r.record.served_name,
                    suite,
                )
                passed = score.score >= gate.min_score
                reason = score.detail
                value = score.score
            except EngineUnreachable as err:
                log.warning("eval gate of %s: %s did not answer (%s); trying again later", m.name, r.id, err)
                self._retry_at[key] = now + RETRY_SECONDS
                return
            except EvalFailed as err:
                passed, reason, value = False, str(err), 0.0
            result = EvalResult(
                model=m.name,
                version=version,
                revision=m.spec.weights.revision,
                source=m.spec.weights.source,
                suite=gate.suite,
                min_score=gate.min_score,
                score=value,
                passed=passed,
                reason=reason,
                replica=r.id,
                at=self._wall(),
            )
            await self.book.record(result)
            (log.info if passed else log.warning)("eval gate of %s: %s", m.name, result.describe())
            self._notify()
        except Exception:
            log.exception("eval gate of %s: the evaluation failed; trying again later", m.name)
            self._retry_at[key] = now + RETRY_SECONDS
        finally:
            self._tasks.pop(key, None)

    # -- what operators see --------------------------------------------------

    def status(self, m: Model, replicas: Sequence[Replica], want: int) -> tuple[str, str]:
        """(rollout, eval gate) lines for ``llmgw models`` and ``llmgw explain``."""
        rollout = ""
        ro = self.book.rollouts.get(m.name)
        label = m.spec.revision_label if m.spec is not None else m.version
        if ro is not None and ro.target == m.version:
            new = sum(1 for r in replicas if r.record.version == m.version and r.ready)
            if ro.state == "rolling":
                rollout = f"rolling to {label}: {new} of {want} on the new revision"
            elif ro.state == "rolled_back":
                rollout = f"rolled back from {label} to {ro.previous}: {ro.reason}"
        gate = ""
        if m.spec is not None and m.spec.eval_gate is not None:
            res = self._result(m, m.version)
            if res is not None:
                gate = res.describe()
            elif m.name in self._waiting:
                gate = f"waiting: {self._waiting[m.name]}"
            elif (m.name, m.version) in self._tasks:
                gate = f"running suite {m.spec.eval_gate.suite} on {label}"
            else:
                gate = f"pending: {label} is evaluated once a replica of it is ready"
        return rollout, gate


def _of(replicas: Sequence[Replica], replica_id: str, version: str) -> bool:
    return any(r.id == replica_id and r.record.version == version for r in replicas)
