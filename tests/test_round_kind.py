"""domino.round_kind.RoundKindChooser: the warm-up plays both kinds (each one's first round
unmeasured), then the faster kind (judged by paired rounds: a look at one kind against the
other's rate of just before) with looks at the slower one at an interval that doubles
while the lead holds clearly and starts over when it changes, and a change in speed is
followed."""

import random

import pytest

from domino.round_kind import ROUND_KINDS, RoundKindChooser


def play(chooser, rounds, ms_per_token):
    """``rounds`` rounds, each kind costing ``ms_per_token[kind]`` ms per token (2 tokens a
    round): the kinds played, in order."""
    kinds = []
    for _ in range(rounds):
        kind = chooser.choose()
        chooser.record(kind, 2, 2 * ms_per_token[kind])
        kinds.append(kind)
    return kinds


def test_warmup_alternates_starting_with_the_tree():
    assert play(RoundKindChooser(warmup=2), 4, {"tree": 1.0, "chain": 1.0}) == ["tree", "chain", "tree", "chain"]


@pytest.mark.parametrize("fast", ROUND_KINDS)
def test_the_faster_kind_is_played_and_the_other_looked_at_ever_more_rarely(fast):
    """After the warm-up: 8 rounds of the leader, a look at the other kind, then 16, 32 (the
    lead holding clearly each time, ``looks`` pairs made), then every 64th round at most."""
    slow = next(k for k in ROUND_KINDS if k != fast)
    chooser = RoundKindChooser(warmup=2, explore_every=8, max_explore_every=64, looks=2.0)
    kinds = play(chooser, 4 + 300, {fast: 1.0, slow: 3.0})[4:]
    looks = [i for i, k in enumerate(kinds) if k == slow]
    assert looks == [8, 25, 58, 123, 188, 253]
    assert chooser.leader() == fast and chooser.rate(fast) == pytest.approx(1.0)


def test_looks_stay_close_until_the_evidence_is_enough():
    """However clear the lead, the interval stays ``explore_every`` until ``looks`` paired
    comparisons exist (single rounds scatter widely: a few unlucky looks after the warm-up
    once handed the chain ~150 rounds in a new process's first call), then doubles."""
    chooser = RoundKindChooser(warmup=2, explore_every=8, max_explore_every=64, looks=6.0)
    kinds = play(chooser, 4 + 120, {"tree": 1.0, "chain": 3.0})[4:]
    looks = [i for i, k in enumerate(kinds) if k == "chain"]
    # one pair from the warm-up (the tree's second round had no chain rate to pair with), one
    # a look: the fifth look makes six, and the interval doubles from there
    assert looks == [8, 17, 26, 35, 44, 61, 94]
    assert chooser.pairs == 8 and chooser.interval == 64


def test_the_interval_starts_over_when_a_look_changes_the_lead():
    """The tree leads; the chain gets 4x faster while unplayed: the first look at it takes
    the lead, and the next look at the tree comes after explore_every rounds again."""
    chooser = RoundKindChooser(warmup=1, explore_every=2, max_explore_every=16, memory=1.0, looks=1.0)
    play(chooser, 2 + 2 + 1 + 4 + 1, {"tree": 1.0, "chain": 2.0})  # looks after 2 and 4 tree rounds
    assert chooser.leader() == "tree" and chooser.interval == 8
    kinds = play(chooser, 9 + 3, {"tree": 1.0, "chain": 0.25})
    assert kinds[:9] == ["tree"] * 8 + ["chain"] and chooser.leader() == "chain"
    assert kinds[9:] == ["chain", "chain", "tree"] and chooser.interval == 4  # lead held by the chain: 2 -> 4


def test_a_change_in_speed_is_followed():
    """The chain leads, then slows to 4x the tree's cost: within a few looks at the tree
    (here the paired comparisons remember ~2) the lead changes."""
    chooser = RoundKindChooser(warmup=1, explore_every=4, memory=4.0, looks=2.0)
    play(chooser, 20, {"tree": 2.0, "chain": 1.0})
    assert chooser.leader() == "chain"
    kinds = play(chooser, 80, {"tree": 2.0, "chain": 8.0})
    assert chooser.leader() == "tree" and kinds[-8:].count("tree") >= 6


def test_hard_stretches_do_not_hand_the_lead_to_the_slower_kind():
    """The tree keeps more tokens per ms than the chain at every moment, but both keep fewer
    in hard stretches of a response (tokens a round drawn around each kind's mean, as real
    rounds scatter). Judged by paired rounds from the same stretch, the tree keeps the lead:
    under 15 % of the rounds are chains over six seeds (4.6 % with this chooser; comparing
    each kind's own faded rate, a hard-stretch tree against an easy-stretch chain, played
    39 % chains: benchmarks/round_kind_sim.py's "stretches")."""
    easy, hard = ((5, 22), (3.5, 18.5)), ((1.5, 20), (1.2, 18))
    chains = rounds = 0
    for seed in range(6):
        rng, chooser = random.Random(seed), RoundKindChooser()
        for stretch, length in [(easy, 150), (hard, 60)] * 6:
            for _ in range(length):
                kind = chooser.choose()
                mean, ms = stretch[kind == "chain"]
                chooser.record(kind, max(1, round(rng.gauss(mean, 0.6 * mean))), ms)
                chains += kind == "chain"
                rounds += 1
    assert chains < 0.15 * rounds


def test_a_look_pairs_with_the_leaders_rate_of_just_before():
    """The advantage is the chain's tokens against what the tree kept in the same time at
    its rate of just before: a look at the chain (2 tokens in 4 ms) after tree rounds of
    1 token per 2 ms counts as 2 against 2, a tie, whatever the tree's rates long before."""
    chooser = RoundKindChooser(warmup=1, explore_every=2, memory=1.0, looks=1.0)
    play(chooser, 2 + 2, {"tree": 4.0, "chain": 1.0})  # warm-up (unmeasured), two tree rounds
    assert chooser.choose() == "chain"
    chooser.record("tree", 1, 2.0)  # the leader's rate just before: 0.5 tokens per ms
    chooser.since_look = chooser.interval
    assert chooser.choose() == "chain"
    chooser.record("chain", 2, 4.0)
    assert chooser.advantage() == pytest.approx(1.0) and chooser.leader() == "tree"


def test_a_kinds_first_round_is_not_measured():
    """A first round on cold caches (here 500x the tree's usual time) leaves no trace: the
    tree still leads once warm, where counting it had handed the lead to the slower chain."""
    chooser = RoundKindChooser(warmup=2, looks=2.0)
    assert chooser.choose() == "tree"
    chooser.record("tree", 2, 1000.0)
    assert chooser.rate("tree") == 0.0 and chooser.rounds["tree"] == 1
    kinds = play(chooser, 3 + 20, {"tree": 1.0, "chain": 2.0})
    assert kinds[:3] == ["chain", "tree", "chain"]  # the rest of the warm-up
    assert chooser.leader() == "tree" and chooser.rate("tree") == pytest.approx(1.0)
    assert kinds[3:].count("chain") == 1  # one look, after explore_every (8) tree rounds


def test_no_evidence_rates_zero_and_ties_go_to_the_tree():
    chooser = RoundKindChooser()
    assert chooser.rate("tree") == chooser.rate("chain") == 0.0 and chooser.leader() == "tree"


@pytest.mark.parametrize("kw,msg", [(dict(warmup=0), "warmup"), (dict(warmup=1.5), "warmup"),
                                    (dict(explore_every=0), "explore_every"), (dict(explore_every=True), "explore_every"),
                                    (dict(explore_every=8, max_explore_every=4), "max_explore_every"),
                                    (dict(memory=0.5), "memory"), (dict(memory=float("nan")), "memory"),
                                    (dict(looks=0.5), "looks"), (dict(looks=float("nan")), "looks")])
def test_bad_arguments(kw, msg):
    with pytest.raises(ValueError, match=msg):
        RoundKindChooser(**kw)


def test_record_names_the_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        RoundKindChooser().record("beam", 1, 1.0)
