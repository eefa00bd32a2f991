"""Test helpers shared by unit and integration tests: ports, processes, etcd."""
