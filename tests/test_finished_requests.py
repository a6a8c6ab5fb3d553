"""A request of a batch that finishes (EOS, the token limit, a stop string) leaves the
batch: the target's forwards, the drafts and the caches carry only the requests still
decoding, in the speculative loop (chains and trees) and in the plain loop alike, and
every request's output stays the target's own."""

import pytest

from engine_cases import prompts
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
    of every forward of the target, in order)."""
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
