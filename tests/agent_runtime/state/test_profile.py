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


def test_work_outside_the_backend_counts_in_every_open_phase_and_nowhere_without_a_profile():
    """`count_work` (a cycle's training, the probe's own model) adds to the phase running and to those enclosing it,
    not to a closed one; the student's forward without gradients is forward work; a misspelt name is an error."""
    from agent_runtime.state.profile import count_work, profiled

    count_work(train_tokens=5)  # no active profile: nothing to tell, no error
    profile = Profile()
    with profile.phase("CONSOLIDATE"):
        with profiled("CONSOLIDATE: train"):
            count_work(train_tokens=100, teacher_tokens=40, scored_tokens=7)
        with profiled("PROMOTE: probe"):
            count_work(prompt_tokens=30, generated_tokens=2, decisions=3)
    with profile.phase("after"):
        pass
    rows = profile.phases
    train, probe, outer = rows["CONSOLIDATE: train"], rows["PROMOTE: probe"], rows["CONSOLIDATE"]
    assert (train.train_tokens, train.teacher_tokens, train.scored_tokens, train.forward_tokens) == (100, 40, 7, 47)
    assert (probe.prompt_tokens, probe.forward_tokens, probe.decisions, probe.train_tokens) == (30, 32, 3, 0)
    assert (outer.train_tokens, outer.forward_tokens, outer.decisions) == (100, 79, 3)
    assert rows["after"].forward_tokens == rows["after"].train_tokens == 0
    with pytest.raises(TypeError, match="train_tokenz"):
        rows["after"].count(train_tokenz=1)
