"""The run profile's memory rows (`agent_runtime.state.profile`): each phase's own peak, nested phases folded into
the enclosing one, and rows that compare equal kept apart."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from agent_runtime.state.profile import Profile, memory_mb

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the peak comes from /proc/self")


def test_each_phase_keeps_its_own_peak_and_an_enclosing_phase_the_largest():
    profile = Profile()
    assert profile.peak_is_phase, "the high-water mark can be reset on Linux"
    with profile.phase("outer"):
        big = np.ones(40_000_000)  # 305 MB, touched
        del big
        with profile.phase("inner"):
            small = np.ones(5_000_000)  # 38 MB
            del small
    with profile.phase("after"):
        pass
    rows = profile.phases
    now = memory_mb()["VmRSS"]
    assert rows["outer"].peak_rss_mb >= rows["inner"].peak_rss_mb + 200, "the outer phase saw the 305 MB array"
    assert rows["inner"].peak_rss_mb < now + 100, "the inner phase's peak is its own, not the outer's"
    assert rows["after"].peak_rss_mb < now + 50 and rows["after"].end_rss_mb > 0


def test_rows_with_equal_numbers_are_closed_by_identity():
    """Two open rows that compare equal (both fresh) must each close their own entry."""
    profile = Profile()
    with profile.phase("a"), profile.phase("b"):
        pass
    with profile.phase("a"):
        pass
    assert profile.phases["a"].times == 2 and profile.phases["b"].times == 1
    assert not profile.open_phases()


def test_a_phase_counts_the_prompt_tokens_its_prefix_store_left_to_run():
    """`prefix()` gives the acting backend's store counters (`PrefixCacheStats`): each phase gets what ran in it,
    an enclosing phase its inner phases' too; no store, no count."""

    class Stats:
        prefilled_tokens = 0

    stats = Stats()
    profile = Profile(prefix=lambda: stats)
    with profile.phase("play"):
        stats.prefilled_tokens += 120
        with profile.phase("inner"):
            stats.prefilled_tokens += 30
    with profile.phase("other"):
        pass
    rows = profile.phases
    assert (rows["play"].prefilled_tokens, rows["inner"].prefilled_tokens, rows["other"].prefilled_tokens) == (
        150,
        30,
        0,
    )
    alone = Profile()
    with alone.phase("play"):
        pass
    assert alone.phases["play"].prefilled_tokens == 0
