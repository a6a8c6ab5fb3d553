"""A request of a batch that finishes (EOS, the token limit, a stop string) leaves the
batch: the target's forwards, the drafts and the caches carry only the requests still
decoding, in the speculative loop (chains and trees) and in the plain loop alike, and
every request's output stays the target's own."""

import pytest

from domino.budget import cost_batch_sizes
from engine_cases import flat_costs, prompts
from tiny_models import tiny_generator

N = 24


def early_eos(gen, ps):
    """An EOS that request 0 writes within its first 6 tokens and request 1 not within N
    (None when there is none), and request 0's length with it."""
    gen.eos_ids = []
    first = gen.generate_target_only(ps[0], max_new_tokens=6).token_ids
    rest = gen.generate_target_only(ps[1], max_new_tokens=N).token_ids
    for j, t in enumerate(first[1:], start=1):
        if t not in rest and t not in first[:j]:
            return t, j + 1
    return None, None


def decode_counting_rows(gen, ps, method: str, num_drafts: int = 3):
    """``ps`` decoded greedily by ``method`` ("chain": chains of ``num_drafts``, "tree": the
    default tree, "plain": generate_plain), N tokens at most: (the outputs, the batch size
    of every forward of the target, in order). The budget's costs are measured first, so
    that their timed forwards are not counted."""
    if method == "tree":
        for size in cost_batch_sizes(len(ps)):
            gen.round_costs(size)
    rows = []
    handle = gen.target.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]),
                                                  with_kwargs=True)
    try:
        if method == "plain":
            return gen.generate_plain(ps, max_new_tokens=N).token_ids, rows
        kw = dict(tree=None, num_drafts=num_drafts) if method == "chain" else dict(lookup_tokens=0)
        return gen.generate(ps, max_new_tokens=N, **kw).token_ids, rows
    finally:
        handle.remove()


@pytest.mark.parametrize("method", ["chain", "tree", "plain"])
def test_a_finished_request_leaves_the_batch(method):
    """Request 0 ends at an early EOS while requests 1 and 2 run to the token limit: from
    then on the target's forwards carry two rows, and every output is the target's own."""
    gen = tiny_generator("qwen3")
    checked = 0
    for seed in range(30):
        ps = prompts(3, seed)
        eos, short = early_eos(gen, ps)
        if eos is None:
            continue
        gen.eos_ids = [eos]
        want = gen.generate_target_only(ps, max_new_tokens=N).token_ids
        if len(want[0]) != short or any(len(w) < N for w in want[1:]):
            continue
        got, rows = decode_counting_rows(gen, ps, method)
        assert got == want, seed
        # the prefill carries all three; once request 0 has its EOS, two rows (one, once
        # a round has taken request 1 or 2 to the token limit before the other)
        assert rows[0] == 3 and 2 in rows and rows == sorted(rows, reverse=True), rows
        if method == "plain":  # one forward a token: request 0's `short` tokens, then it has left
            assert rows.index(2) == short and rows[-1] == 2
        checked += 1
        if checked == 2:
            break
    assert checked == 2


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_the_middle_rows_leave_and_the_first_goes_on(method):
    """Requests 1 and 2 finish (at different rounds) while request 0 goes on: row 0 stays
    request 0, the batch shrinks 3 -> 2 -> 1, and each request's output is its own."""
    gen = tiny_generator("qwen3")
    checked = 0
    for seed in range(40):
        gen.eos_ids = []
        ps = prompts(3, seed)
        ends = [gen.generate_target_only(p, max_new_tokens=N).token_ids for p in ps]

        def first(s, t):
            return ends[s].index(t) if t in ends[s] else None

        eos = next((t for t in range(64) if first(0, t) is None and first(1, t) is not None
                    and first(2, t) is not None and 2 <= first(1, t) < first(2, t) - 3), None)
        if eos is None:
            continue
        gen.eos_ids = [eos]
        want = gen.generate_target_only(ps, max_new_tokens=N).token_ids
        got, rows = decode_counting_rows(gen, ps, method, num_drafts=2)
        assert got == want, seed
        assert rows[0] == 3 and rows[-1] == 1 and rows == sorted(rows, reverse=True), rows
        checked += 1
        if checked == 2:
            break
    assert checked == 2


@pytest.mark.parametrize("tree", [None, "auto"])
def test_the_rounds_after_a_request_has_left_are_planned_as_the_smaller_batch(tree):
    """The budget plans each round with the costs of the batch size of the rows it carries
    (domino.budget.cost_batch_size): rigged so that at batch 2 no draft pays and alone every
    draft does, request 1's rounds verify one token while request 0 is in the batch and more
    once request 0 has ended at its EOS; under "auto" the rounds of each batch size are
    timed by that size's round-kind chooser. The outputs are the target's own. (Planned
    with the call's batch size alone, every round is a plain step.)"""
    gen = tiny_generator("qwen3")
    for seed in range(30):
        ps = prompts(2, seed)
        eos, short = early_eos(gen, ps)
        if eos is not None:
            break
    gen.eos_ids = [eos]
    gen._costs[2] = flat_costs(10.0, 100.0, 50.0)  # two rows: verifying more than the anchor never pays
    gen._costs[1] = flat_costs(20.0, 10.0, 0.05)  # one row: every draft pays
    want = gen.generate_target_only(ps, max_new_tokens=N).token_ids
    assert len(want[0]) == short < len(want[1]) == N
    res = gen.generate(ps, max_new_tokens=N, tree=tree, lookup_tokens=0)
    assert res.token_ids == want
    together = len(res.verified_lengths[0])  # request 0's rounds: the ones with both rows
    assert set(res.verified_lengths[1][:together]) == {1}
    alone = res.verified_lengths[1][together:]  # the last one drafts what the token limit leaves room for
    assert len(alone) > 1 and min(alone[:-1]) > 1, res.verified_lengths
    if tree == "auto":
        assert sum(gen._round_kinds[2].rounds.values()) == together
        assert sum(gen._round_kinds[1].rounds.values()) == len(alone)


def test_the_costs_of_every_batch_size_a_call_may_shrink_to_are_ready_before_it_decodes(monkeypatch):
    """A call of 5 requests has the costs of batch sizes 1, 2, 4 and 5 (measured or read
    from disk) before the target's first forward, so that no round waits on a measurement;
    its requests end at different rounds (EOS), and every size its rounds then read is
    among them."""
    import domino.generate

    gen = tiny_generator("qwen3")
    gen.eos_ids = []
    ps = prompts(5, seed=3)
    ends = [gen.generate_target_only(p, max_new_tokens=N).token_ids for p in ps]
    # an EOS that request 0 writes early and the others later or never: the batch shrinks
    eos = next(t for t in range(64) if t in ends[0][1:4] and all(t not in e[:4] for e in ends[1:]))
    gen.eos_ids = [eos]
    measured, events, read = [], [], []
    rigged = flat_costs(20.0, 10.0, 0.05)  # every draft pays: rounds of several tokens
    monkeypatch.setattr(domino.generate.budget, "round_costs",
                        lambda g, size: measured.append(size) or events.append("measure") or rigged)
    real = domino.generate.budget.cost_batch_size
    monkeypatch.setattr(domino.generate.budget, "cost_batch_size",
                        lambda rows, b: read.append((rows, real(rows, b))) or read[-1][1])
    handle = gen.target.register_forward_pre_hook(lambda *a: events.append("forward"))
    try:
        res = gen.generate(ps, max_new_tokens=N, tree=None)
    finally:
        handle.remove()
    assert measured == [1, 2, 4, 5] and events[:5] == ["measure"] * 4 + ["forward"] and "measure" not in events[5:]
    assert res.token_ids == gen.generate_target_only(ps, max_new_tokens=N).token_ids
    assert {rows for rows, _ in read} > {5}  # rounds ran with fewer rows
    assert all(size in measured for _, size in read)
