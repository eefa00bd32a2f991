"""The node's weights cache: hub fetches (a fake at the Hub seam), local paths, names, removal.

The hub is the one seam faked here (:class:`FakeHub` writes files the way a
download would, slowly enough to be seen in progress); everything else is
real: files on disk, the index across a restart, an agent with its stream
to a scripted control plane, and huggingface_hub itself against a closed
port for the unreachable-hub path.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from llmgw.agent.weights import (
    HubRef,
    HuggingFaceHub,
    WeightsCache,
    WeightsEntry,
    WeightsState,
    hub_dir,
    parse_hub,
)
from llmgw.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from llmgw.v1 import agent_pb2 as pb
from tests.support.procs import free_port

from .conftest import start_fields

CHUNK = 64 * 1024


class FakeHub:
    """Writes ``files`` chunks of CHUNK bytes into the target, one chunk every ``pace`` seconds."""

    def __init__(self, files: int = 3, chunks: int = 4, pace: float = 0.05, fail: str = ""):
        self.files, self.chunks, self.pace, self.fail = files, chunks, pace, fail
        self.downloads = 0
        self.revisions: list[str] = []
        self.release = threading.Event()
        self.release.set()

    @property
    def size(self) -> int:
        return self.files * self.chunks * CHUNK

    def total_bytes(self, repo_id: str, revision: str) -> int | None:
        return self.size

    def download(self, repo_id: str, revision: str, into: Path) -> None:
        self.downloads += 1
        self.revisions.append(revision)
        self.release.wait(30)
        if self.fail:
            raise ConnectionError(self.fail)
        into.mkdir(parents=True, exist_ok=True)
        for i in range(self.files):
            with open(into / f"model-{i}.safetensors", "wb") as f:
                for _ in range(self.chunks):
                    f.write(b"x" * CHUNK)
                    f.flush()
                    time.sleep(self.pace)


class Seen:
    def __init__(self) -> None:
        self.changes: list[WeightsEntry] = []

    def weights_changed(self, entry: WeightsEntry) -> None:
        self.changes.append(entry)


async def test_hub_fetch_reports_progress_then_ready_with_its_disk_use(tmp_path):
    hub, seen = FakeHub(), Seen()
    cache = WeightsCache(tmp_path / "w", hub, seen)
    entry = cache.fetch("hf://org/tiny@v1")
    assert (entry.name, entry.state, entry.in_place) == ("org/tiny", WeightsState.FETCHING, False)
    path = await cache.resolve("hf://org/tiny@v1")
    assert path == str(tmp_path / "w" / "hub" / "org--tiny")
    done = cache.get("org/tiny")
    assert done.state is WeightsState.READY and done.size_bytes == hub.size
    fetching = [e for e in seen.changes if e.state is WeightsState.FETCHING]
    progress = [e.fetched_bytes for e in fetching]
    assert any(0 < b < hub.size for b in progress), f"no partial progress was reported: {progress}"
    assert progress == sorted(progress) and fetching[-1].total_bytes == hub.size
    await cache.aclose()


async def test_concurrent_requests_for_one_source_share_one_download(tmp_path):
    hub = FakeHub()
    hub.release.clear()
    cache = WeightsCache(tmp_path / "w", hub, Seen())
    waiting = [asyncio.create_task(cache.resolve("hf://org/tiny")) for _ in range(3)]
    await asyncio.sleep(0.2)
    hub.release.set()
    paths = await asyncio.gather(*waiting)
    assert len(set(paths)) == 1 and hub.downloads == 1
    await cache.aclose()


async def test_failed_fetch_says_what_to_do_and_fetching_again_retries(tmp_path):
    hub = FakeHub(fail="connection refused")
    cache = WeightsCache(tmp_path / "w", hub, Seen(), hub_label="http://mirror.example")
    with pytest.raises(Unavailable) as err:
        await cache.resolve("hf://org/tiny")
    message = str(err.value)
    assert "cannot fetch hf://org/tiny from http://mirror.example" in message
    assert "connection refused" in message and "absolute path" in message
    assert cache.get("org/tiny").state is WeightsState.FAILED

    hub.fail = ""
    assert await cache.resolve("hf://org/tiny")
    assert cache.get("org/tiny").state is WeightsState.READY and hub.downloads == 2
    await cache.aclose()


async def test_another_revision_under_a_held_name_is_refused(tmp_path):
    cache = WeightsCache(tmp_path / "w", FakeHub(pace=0), Seen())
    await cache.resolve("hf://org/tiny@v1")
    with pytest.raises(AlreadyExists, match=r"already hold hf://org/tiny@v1; remove them first"):
        cache.fetch("hf://org/tiny@v2")
    # Under another name it is a second entry.
    assert cache.fetch("hf://org/tiny@v2", name="tiny-v2").state is WeightsState.FETCHING
    await cache.aclose()


def _files(folder: str) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in Path(folder).iterdir()}


async def test_an_engine_needing_another_revision_gets_it_beside_the_one_in_use(tmp_path):
    # A rolling update: old replicas read v1 while new ones need v2 of the same repository.
    hub = FakeHub(pace=0)
    cache = WeightsCache(tmp_path / "w", hub, Seen())
    v1 = await cache.resolve("hf://org/tiny@v1")
    v1_files = await asyncio.to_thread(_files, v1)
    v2 = await cache.resolve("hf://org/tiny@v2")
    assert v1 == str(tmp_path / "w" / "hub" / "org--tiny")
    assert v2 == str(tmp_path / "w" / "hub" / "org--tiny@v2")
    assert hub.revisions == ["v1", "v2"], "each revision fetched at its own pin"
    assert await asyncio.to_thread(_files, v1) == v1_files, "v1 left as it was"
    assert {(e.name, e.source) for e in cache.snapshot()} == {
        ("org/tiny", "hf://org/tiny@v1"),
        ("org/tiny@v2", "hf://org/tiny@v2"),
    }
    # Asked again, each source is the entry that holds it: no second download.
    assert await cache.resolve("hf://org/tiny@v2") == v2 and await cache.resolve("hf://org/tiny@v1") == v1
    assert hub.downloads == 2
    await cache.aclose()


async def test_an_engine_uses_the_entry_holding_its_source_whatever_its_name(tmp_path):
    hub = FakeHub(pace=0)
    cache = WeightsCache(tmp_path / "w", hub, Seen())
    await cache.resolve("hf://org/tiny@v1")
    cache.fetch("hf://org/tiny@v3", name="tiny-v3")  # an operator's prefetch for the next roll
    path = await cache.resolve("hf://org/tiny@v3")
    assert path == str(tmp_path / "w" / "hub" / "org--tiny@v3") and hub.downloads == 2
    assert sorted(e.name for e in cache.snapshot()) == ["org/tiny", "tiny-v3"]
    await cache.aclose()


def test_a_hub_revision_is_parsed_and_named_safely():
    assert parse_hub("hf://org/tiny@refs/pr/1") == HubRef("org/tiny", "refs/pr/1")
    assert hub_dir(HubRef("org/tiny", "refs/pr/1"), "x") == "org--tiny@refs--pr--1"
    for bad in (
        "hf://org/tiny@",
        "hf://org/tiny@../../etc",
        "hf://org/tiny@a b",
        "hf://org/tiny@v/../x",
        "hf://org/tiny@" + "a" * 129,
    ):
        with pytest.raises(InvalidArgument, match="hf://ORG/NAME"):
            parse_hub(bad)


async def test_local_path_is_used_in_place_and_other_sources_pass_through(tmp_path):
    local = tmp_path / "llama"
    local.mkdir()
    (local / "w.bin").write_bytes(b"1" * 1000)
    cache = WeightsCache(tmp_path / "w", FakeHub(), Seen())
    assert await cache.resolve(str(local)) == str(local)
    entry = cache.get(str(local))
    assert entry.in_place and entry.size_bytes == 1000 and entry.state is WeightsState.READY
    # Not ours to fetch: a bare hub id the engine may fetch itself, a catalog name.
    assert await cache.resolve("org/name") == "org/name"
    assert await cache.resolve("demo") == "demo"
    assert [e.name for e in cache.snapshot()] == [str(local)]
    with pytest.raises(NotFound, match="does not exist on this node"):
        cache.fetch(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="neither hf://"):
        cache.fetch("relative/path")
    with pytest.raises(InvalidArgument, match=r"hf://ORG/NAME\[@REVISION\]"):
        parse_hub("hf://just-a-name")


async def test_remove_deletes_fetched_files_keeps_in_place_ones_and_refuses_while_in_use(tmp_path):
    local = tmp_path / "llama"
    local.mkdir()
    cache = WeightsCache(tmp_path / "w", FakeHub(pace=0), Seen())
    fetched = Path(await cache.resolve("hf://org/tiny"))
    cache.fetch(str(local))
    with pytest.raises(FailedPrecondition, match="used by a replica"):
        await cache.remove("org/tiny", in_use=lambda source: source == "hf://org/tiny")
    removed = await cache.remove("org/tiny", in_use=lambda source: False)
    assert removed.size_bytes > 0 and not await asyncio.to_thread(fetched.exists)
    await cache.remove(str(local), in_use=lambda source: False)
    assert local.is_dir()
    with pytest.raises(NotFound, match="no weights named"):
        await cache.remove("org/tiny", in_use=lambda source: False)
    await cache.aclose()


async def test_ready_entries_survive_a_restart_and_vanished_ones_are_forgotten(tmp_path):
    local = tmp_path / "llama"
    local.mkdir()
    cache = WeightsCache(tmp_path / "w", FakeHub(pace=0), Seen())
    await cache.resolve("hf://org/tiny")
    await cache.resolve("hf://org/other")
    cache.fetch(str(local))
    await cache.aclose()
    local.rmdir()

    again = WeightsCache(tmp_path / "w", FakeHub(), Seen())
    assert {e.name for e in again.snapshot()} == {"org/tiny", "org/other"}
    assert all(e.state is WeightsState.READY for e in again.snapshot())


async def test_real_huggingface_hub_against_an_unreachable_endpoint_fails_the_fetch(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"
    cache = WeightsCache(tmp_path / "w", HuggingFaceHub(endpoint, timeout=2), Seen(), hub_label=endpoint)
    with pytest.raises(Unavailable) as err:
        await cache.resolve("hf://org/tiny")
    assert f"cannot fetch hf://org/tiny from {endpoint}:" in str(err.value)
    assert not (tmp_path / "w" / "hub" / "org--tiny" / "model.safetensors").exists()


async def test_replica_with_hub_weights_starts_on_the_fetched_path_and_reports_them(control, start_agent):
    hub = FakeHub()
    agent = start_agent([control.address], hub=hub)
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1", engine_args={"model": "hf://org/tiny"}))
    await control.wait_state("r1", pb.REPLICA_STATE_STARTING)
    assert "waiting for weights hf://org/tiny" in control.statuses("r1")[0].message
    await control.wait_state("r1", pb.REPLICA_STATE_READY)
    header = (agent.state_dir / "replicas" / "r1" / "engine.log").read_text().splitlines()[0]
    given = header.split("--model ", 1)[1].split()[0]
    assert given == str(Path(agent.config.state_dir) / "weights" / "hub" / "org--tiny")

    def ready_in_heartbeat():
        return [
            w
            for hb in control.heartbeats()
            for w in hb.weights
            if w.name == "org/tiny" and w.state == pb.WEIGHTS_STATE_READY
        ]

    reported = (await control.wait_for("the weights in a heartbeat", ready_in_heartbeat))[0]
    assert reported.size_bytes == hub.size and reported.source == "hf://org/tiny"
    progress = [m.weights for m in control.received if m.WhichOneof("msg") == "weights"]
    assert any(w.state == pb.WEIGHTS_STATE_FETCHING and w.fetched_bytes > 0 for w in progress)


async def test_replicas_of_two_revisions_run_side_by_side_each_on_its_own_weights(control, start_agent):
    # A rolling update on one node: the v2 replica starts while the v1 one still serves.
    hub = FakeHub(pace=0)
    agent = start_agent([control.address], hub=hub)
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1", engine_args={"weights": "hf://org/tiny@v1"}))
    await control.wait_state("r1", pb.REPLICA_STATE_READY)
    control.start_replica(**start_fields("r2", engine_args={"weights": "hf://org/tiny@v2"}, gpu_indices=[1]))
    await control.wait_state("r2", pb.REPLICA_STATE_READY)
    hub_root = Path(agent.config.state_dir) / "weights" / "hub"
    for rid, path in (("r1", hub_root / "org--tiny"), ("r2", hub_root / "org--tiny@v2")):
        header = (agent.state_dir / "replicas" / rid / "engine.log").read_text().splitlines()[0]
        assert header.split("--model ", 1)[1].split()[0] == str(path), header
    assert hub.revisions == ["v1", "v2"]
    assert control.statuses("r1")[-1].state == pb.REPLICA_STATE_READY, "the v1 replica untouched"


async def test_replica_whose_hub_weights_cannot_be_fetched_fails_with_that_reason(control, start_agent):
    start_agent([control.address], hub=FakeHub(fail="Name or service not known"))
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1", engine_args={"model": "hf://org/tiny"}))
    failed = await control.wait_state("r1", pb.REPLICA_STATE_FAILED)
    assert "cannot get the engine its weights: cannot fetch hf://org/tiny" in failed.message
    assert "Name or service not known" in failed.message
