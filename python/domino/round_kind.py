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
led. So the generator measures both kinds as it runs: tokens kept per millisecond of wall
time, per kind, each kind's evidence fading as it is played again (acceptance moves along
a response), and plays the faster kind, with the other now and then so that a change is
noticed: after ``explore_every`` rounds at first, the interval doubling (up to
``max_explore_every``) each time a look at the other kind leaves the lead where it was,
so a machine where one kind is clearly faster soon spends almost no rounds on the other.

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
the warm-up) in the first call of each of three new processes, 1 in later calls.

Greedy only: timing decides the rounds, and a sampled request's output under a seed must
not depend on timing (sampled requests never get "auto"'s tree anyway).
"""

from __future__ import annotations

import time

__all__ = ["ROUND_KINDS", "RoundKindChooser"]

ROUND_KINDS = ("tree", "chain")


class RoundKindChooser:
    """Picks "tree" or "chain" for each round from the tokens per millisecond each kind has
    given so far.

    ``warmup``: rounds of each kind played first, alternating, the tree first; each kind's
    first round is not measured (cold caches), the rest of the warm-up is.
    ``explore_every``: after the warm-up, the kind that is behind is played once after this
    many rounds of the leader; the interval doubles, up to ``max_explore_every``, whenever
    such a round leaves the lead unchanged, and starts over when the lead changes.
    ``memory``: a kind's tokens and milliseconds fade by ``1 - 1 / memory`` each time it is
    played, so its rate follows its last ~``memory`` rounds. ``clock``: seconds, for
    :meth:`now` (the generator times rounds with it)."""

    def __init__(self, warmup: int = 6, explore_every: int = 8, max_explore_every: int = 64, memory: float = 24.0,
                 clock=time.perf_counter):
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
        self.warmup, self.keep, self.clock = warmup, 1.0 - 1.0 / memory, clock
        self.explore_every, self.max_explore_every = explore_every, max_explore_every
        self.interval = explore_every  # rounds of the leader before the next look at the other kind
        self.since_look = 0  # rounds of the leader since the last look
        self.tokens = dict.fromkeys(ROUND_KINDS, 0.0)
        self.ms = dict.fromkeys(ROUND_KINDS, 0.0)
        self.rounds = dict.fromkeys(ROUND_KINDS, 0)

    def now(self) -> float:
        """The chooser's clock, in seconds."""
        return self.clock()

    def rate(self, kind: str) -> float:
        """Tokens per millisecond ``kind`` has given (faded); 0 before it has been played."""
        return self.tokens[kind] / self.ms[kind] if self.ms[kind] > 0 else 0.0

    def leader(self) -> str:
        """The kind with the higher rate (the tree on a tie)."""
        return max(ROUND_KINDS, key=self.rate)

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
        self.tokens[kind] = self.tokens[kind] * self.keep + tokens
        self.ms[kind] = self.ms[kind] * self.keep + max(ms, 1e-6)
        if not warm:
            return
        if kind == leader:
            self.since_look += 1
        else:  # a look at the other kind: the interval doubles if the lead held, else starts over
            held = self.leader() == leader
            self.interval = min(2 * self.interval, self.max_explore_every) if held else self.explore_every
            self.since_look = 0
