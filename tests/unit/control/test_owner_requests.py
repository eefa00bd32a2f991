"""The leader's book of requests and tokens per owner and model: periods, terms, bounds."""

from __future__ import annotations

from llmgw.control.state import ownerrequests
from llmgw.control.state.ownerrequests import OwnerRequests

T0 = 1_800_000_000.0  # a minute boundary


def test_a_period_sums_the_minutes_in_it_and_zero_means_the_whole_term():
    book = OwnerRequests().term("t1", T0)
    book.add("acme", "demo", 2, 100, T0 + 10)
    book.add("acme", "demo", 1, 50, T0 + 30)  # the same minute
    book.add("acme", "demo", 4, 400, T0 + 3600)
    book.add("acme/x", "other", 1, 9, T0 + 3610)
    now = T0 + 3620
    assert book.over(0, now) == {("acme", "demo"): (7, 550), ("acme/x", "other"): (1, 9)}
    assert book.over(60, now) == {("acme", "demo"): (4, 400), ("acme/x", "other"): (1, 9)}
    assert book.over(7200, now) == {("acme", "demo"): (7, 550), ("acme/x", "other"): (1, 9)}


def test_minutes_older_than_a_day_are_dropped_but_the_terms_totals_keep_them():
    book = OwnerRequests().term("t1", T0)
    book.add("acme", "demo", 5, 50, T0)
    later = T0 + ownerrequests.HISTORY_SECONDS + 120
    book.add("acme", "demo", 1, 10, later)
    assert book.over(ownerrequests.HISTORY_SECONDS, later) == {("acme", "demo"): (1, 10)}
    assert book.totals() == {("acme", "demo"): (6, 60)}


def test_a_new_term_counts_from_zero_and_the_same_term_keeps_counting():
    book = OwnerRequests()
    book.term("t1", T0).add("acme", "demo", 5, 50, T0)
    assert book.term("t1", T0 + 5).totals() == {("acme", "demo"): (5, 50)}
    assert book.term("t2", T0 + 10).totals() == {}
    assert book.since == T0 + 10


def test_pairs_beyond_the_bound_are_not_counted(monkeypatch):
    monkeypatch.setattr(ownerrequests, "MAX_SERIES", 2)
    book = OwnerRequests().term("t1", T0)
    for model in ("a", "b", "c"):
        book.add("acme", model, 1, 1, T0)
    book.add("acme", "a", 1, 1, T0)
    assert book.totals() == {("acme", "a"): (2, 2), ("acme", "b"): (1, 1)}
