"""Which kind of round ``tree="auto"`` runs next for greedy requests: a tree round or a
chain round, chosen by the throughput each kind has delivered.

Both kinds give exactly the target's greedy decoding, so only speed decides, and which is
faster depends on the machine more than on anything the budget's cost tables hold. A tree
round (:data:`domino.tree.DEFAULT_TREE` with the prompt-lookup and datastore chains grafted
on) verifies more tokens than an adaptive chain round and does host work a chain round does
not (the tree's expand steps, the grafts, the tree mask, moving the accepted path's cache
entries). Where a verification forward is compute-bound the extra tokens cost nearly their
full price: on a 2-core AVX2 Zen 3 VM (forty-fourth session, 8 HumanEval prompts, 96
tokens, ``benchmarks/bench_e2e.py``) the adaptive chain ran at 1.39x plain decoding and the
tree at 1.22-1.26x with or without the grafts, while on the AVX-512 and AMX VMs the tree
led. So the generator measures both kinds as it runs and plays the faster, with the other
now and then so that a change is noticed: after ``explore_every`` rounds at first, the
interval doubling (up to ``max_explore_every``) each time a look at the other kind leaves
the lead where it was by a clear margin (:data:`CLEAR_LEAD`), so a machine where one kind
is clearly faster soon spends almost no rounds on the other, and one where they are close
keeps looking.

Which kind is faster is judged from *paired* rounds: a look at the trailing kind against
the leader's rate over its last few rounds (``memory``), both from the same stretch of the
response, as tokens the chain keeps against tokens the tree keeps in the same time
(:meth:`RoundKindChooser.advantage`, faded over the last ~``looks`` looks). Tokens a
round rise and fall along a response, both kinds' together (1-2 in a hard stretch, 5-10 in
boilerplate), and comparing each kind's own faded rate instead, as this chooser did until
the sixtieth session, compared a kind measured in a hard stretch with the other's rate
from an easy one long before: on the AMX Xeon VM the chain took the lead after hard
stretches and kept it into easy ones, where the tree's rate, stale and low, caught up only
one look per up to 64 rounds (170-220 of ~500 rounds played as chains in four of eight
passes of 16 HumanEval prompts, ``benchmarks/round_kind_ab.py``; 33-197 of ~480 in a
new process's first pass, ``benchmarks/engine_speed.py e2e``, 1.59-1.73x plain decoding).
A single round's tokens scatter widely, so the looks stay ``explore_every`` rounds apart
until ``looks`` pairs exist: with 8 and no such floor a few unlucky looks at the tree right
after the warm-up handed the chain ~150 rounds of a first pass. Measured
(``results/round_kind_xeon_session60.txt``): 7-43 chain rounds a pass of
``round_kind_ab.py`` (auto / tree 0.974-1.003, before 0.961-0.991), 19-25 in three first
passes of four and 244 in one (1.68-1.76x plain decoding, mean 1.72x against 1.70x before:
where the kinds run within ~10 % of each other for a stretch, single-round looks take a
while to tell them apart); with the kernels' AVX2 builds, where the kinds run within 3 % of
each other, 0.987x -> 0.994x the faster fixed kind.

The warm-up is 6 rounds of each kind, alternating, and a kind's first round is played but
not measured: it runs on cold caches (in a new process the first tree round pages in the
datastore's index and the tree kernels' buffers: 84-87 ms against a median of 41-42 ms for
the later ones on the Zen 3 VM, forty-fifth session, ``benchmarks/round_kind_first_call.py``).
With that round counted and 2 warm-up rounds each, the first call of a process (``make
run``'s prompt, 128 tokens) ran 17-21 of its ~38 rounds as chains where later calls ran 0-1,
1.46-1.56 s against 1.34-1.41 s (an ad-hoc script before that benchmark existed): the cold
round, and then a round's tokens (1 to 10) varying more than the kinds' speeds differ, let
the chain lead on one or two lucky rounds, and looks at the tree 8, 16, 32 rounds apart
corrected it slowly. With both changes the benchmark measures 12 chain rounds (6 of them
the warm-up) in the first call of each of three new processes, 1 in later calls; with
the paired comparisons on the AMX Xeon VM (sixtieth session), 9 (6 of them the warm-up),
then 4 and 2 while the pairs reach ``looks``.

Greedy only: timing decides the rounds, and a sampled request's output under a seed must
not depend on timing (sampled requests never get "auto"'s tree anyway).
"""

from __future__ import annotations

import time

__all__ = ["ROUND_KINDS", "CLEAR_LEAD", "RoundKindChooser"]

ROUND_KINDS = ("tree", "chain")
# A look that leaves the lead where it was doubles the interval to the next look only if
# the leader is ahead by this factor (advantage() >= 1.2 or <= 1 / 1.2); a closer lead keeps
# the looks ``explore_every`` rounds apart, so a wrong lead between close kinds is soon
# corrected; and only once ``looks`` pairs exist (RoundKindChooser.record).
# ``benchmarks/round_kind_sim.py`` (simulated noisy rounds, 12 seeds; results/
# round_kind_xeon_session60.txt) against the unpaired chooser before: 4.8 % more tokens per
# ms where the text alternates easy and hard stretches, the same where the chain is 11 %
# faster or the kinds are close, 0.25 % less where the tree is 27 % faster (the looks before
# the evidence is enough).
CLEAR_LEAD = 1.2


class RoundKindChooser:
    """Picks "tree" or "chain" for each round from how the two kinds compare where both
    were played close together.

    ``warmup``: rounds of each kind played first, alternating, the tree first; each kind's
    first round is not measured (cold caches), the rest of the warm-up is.
    ``explore_every``: after the warm-up, the kind that is behind is played once after this
    many rounds of the leader; the interval doubles, up to ``max_explore_every``, whenever
    such a round leaves the lead unchanged and clear (:data:`CLEAR_LEAD`) with ``looks``
    pairs made, and starts over otherwise.
    ``memory``: a kind's tokens and milliseconds fade by ``1 - 1 / memory`` each time it is
    played, so :meth:`rate` follows its last ~``memory`` rounds. ``looks``: the paired
    comparisons (:meth:`advantage`) fade by ``1 - 1 / looks`` at each new one. ``clock``:
    seconds, for :meth:`now` (the generator times rounds with it)."""

    def __init__(self, warmup: int = 6, explore_every: int = 8, max_explore_every: int = 64, memory: float = 8.0,
                 looks: float = 16.0, clock=time.perf_counter):
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup must be an int >= 1, got {warmup!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 1:
            raise ValueError(f"explore_every must be an int >= 1, got {explore_every!r}")
        if (isinstance(max_explore_every, bool) or not isinstance(max_explore_every, int)
                or max_explore_every < explore_every):
            raise ValueError(f"max_explore_every must be an int >= explore_every ({explore_every}), "
                             f"got {max_explore_every!r}")
        if not memory >= 1.0:
            raise ValueError(f"memory must be >= 1 round, got {memory!r}")
        if not looks >= 1.0:
            raise ValueError(f"looks must be >= 1, got {looks!r}")
        self.warmup, self.keep, self.keep_pairs, self.clock = warmup, 1.0 - 1.0 / memory, 1.0 - 1.0 / looks, clock
        self.looks = looks
        self.explore_every, self.max_explore_every = explore_every, max_explore_every
        self.interval = explore_every  # rounds of the leader before the next look at the other kind
        self.since_look = 0  # rounds of the leader since the last look
        self.tokens = dict.fromkeys(ROUND_KINDS, 0.0)
        self.ms = dict.fromkeys(ROUND_KINDS, 0.0)
        self.rounds = dict.fromkeys(ROUND_KINDS, 0)
        # paired evidence, faded: the chain's tokens against the tree's in the same time
        self.chain_tokens = self.tree_tokens = 0.0
        self.pairs = 0  # paired comparisons made

    def now(self) -> float:
        """The chooser's clock, in seconds."""
        return self.clock()

    def rate(self, kind: str) -> float:
        """Tokens per millisecond ``kind`` has given over its last rounds played (faded); 0
        before it has been played."""
        return self.tokens[kind] / self.ms[kind] if self.ms[kind] > 0 else 0.0

    def advantage(self) -> float:
        """The chain's tokens per tree token in the same time, from the paired comparisons
        (each a round of one kind against the other's rate just then); 1.0 before any."""
        return self.chain_tokens / self.tree_tokens if self.tree_tokens > 0 else 1.0

    def leader(self) -> str:
        """The kind the paired comparisons favour (the tree on a tie)."""
        return "chain" if self.advantage() > 1.0 else "tree"

    def choose(self) -> str:
        """The kind of the next round."""
        played = sum(self.rounds.values())
        if played < 2 * self.warmup:
            return ROUND_KINDS[played % 2]
        best = self.leader()
        if self.since_look >= self.interval:
            return next(k for k in ROUND_KINDS if k != best)
        return best

    def record(self, kind: str, tokens: int, ms: float) -> None:
        """One round of ``kind`` kept ``tokens`` tokens (over the batch) in ``ms`` milliseconds."""
        if kind not in ROUND_KINDS:
            raise ValueError(f"kind must be one of {ROUND_KINDS}, got {kind!r}")
        warm = sum(self.rounds.values()) >= 2 * self.warmup
        leader = self.leader()
        self.rounds[kind] += 1
        if self.rounds[kind] == 1:  # cold caches: played, not measured (module docstring)
            return
        ms = max(ms, 1e-6)
        other = next(k for k in ROUND_KINDS if k != kind)
        # A pair: this round against what the other kind makes in its time at the other's
        # rate of just before, so both sides come from the same stretch of text (tokens a
        # round rise and fall along a response, both kinds' alike). Only where that rate is
        # fresh: in the warm-up (the kinds alternate) and on a look at the trailing kind
        # (the leader was played just before); never a leader's round against the trailing
        # kind's rate of long ago.
        if self.ms[other] > 0 and (not warm or kind != leader):
            expected = self.rate(other) * ms
            made, would = (tokens, expected) if kind == "chain" else (expected, tokens)
            self.chain_tokens = self.chain_tokens * self.keep_pairs + made
            self.tree_tokens = self.tree_tokens * self.keep_pairs + would
            self.pairs += 1
        self.tokens[kind] = self.tokens[kind] * self.keep + tokens
        self.ms[kind] = self.ms[kind] * self.keep + ms
        if not warm:
            return
        if kind == leader:
            self.since_look += 1
        else:  # a look at the other kind: the interval doubles if the lead held by a clear margin, else starts over
            a = self.advantage()
            clear = (self.leader() == leader and (a >= CLEAR_LEAD or a * CLEAR_LEAD <= 1.0)
                     and self.pairs >= self.looks)
            self.interval = min(2 * self.interval, self.max_explore_every) if clear else self.explore_every
            self.since_look = 0
