"""``llmgw up``'s checks before it starts anything (the cluster itself: tests/integration)."""

from __future__ import annotations

import pytest

from llmgw.cli.localcluster import ClusterError, LocalCluster, Ports
from tests.support.procs import free_port, free_port_pair


@pytest.mark.parametrize(
    ("ports", "says"),
    [
        (Ports(router=18080, control=23790, etcd=23790, console=18081), "both control and etcd"),
        # etcd's peer port is the client port + 1.
        (Ports(router=18080, control=23791, etcd=23790, console=18081), "both control and etcd peer"),
        (Ports(router=18081, control=50051, etcd=23790, console=18081), "both router and console"),
    ],
)
def test_one_port_for_two_roles_is_refused_before_anything_starts(tmp_path, ports, says):
    cluster = LocalCluster(state_dir=tmp_path / "state", ports=ports, agents=1)
    with pytest.raises(ClusterError, match=says):
        cluster.start()
    assert not (tmp_path / "state").exists() and not cluster.children


def test_the_tests_port_picker_never_hands_out_a_port_twice():
    pair = free_port_pair()
    picked = [free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
    assert pair not in picked and pair + 1 not in picked
