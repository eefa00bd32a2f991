"""Facility domains: a node label and a value (rack=r1, power-feed=a, zone=eu-1), and power budgets on them.

A *domain* is every node whose labels (the agent's, with the operator's on
top) carry the value. Domains are what facility holds name
(store.domainholds) and what power budgets bound: the cluster settings'
``power_budgets`` map ``label=value`` to watts, and placement keeps the sum
of the ``power_watts`` of the GPUs in use in each domain within its budget
(decide.placement). Pure data and validation, shared by the settings, the
store and the API so a domain is spelled and checked one way.
"""

from __future__ import annotations

import re

LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def parse_domain(text: str) -> tuple[str, str]:
    """``rack=r1`` -> ``("rack", "r1")``, or ValueError saying what a domain looks like."""
    label, sep, value = text.partition("=")
    if not sep or not LABEL_KEY.match(label) or not value or not LABEL_VALUE.match(value):
        raise ValueError(
            f"domain {text!r} is not LABEL=VALUE (a node label and its value, such as rack=r1): "
            "1-63 letters, digits and '._-' each ('/' also in the label)"
        )
    return label, value
