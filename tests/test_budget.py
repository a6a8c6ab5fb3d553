"""domino.budget: expected tokens, the size choices, calibration, the cost cache."""

import functools
import itertools
import json

import pytest
import torch

import domino_ops
from domino import budget
from domino.budget import Calibration, DepthAcceptance, RoundCosts
from domino.fast_layers import undo_fused_layers, use_fused_layers
from domino.fast_linear import undo_small_batch_linear, use_small_batch_linear
from tiny_models import tiny_generator


def costs(verify, draft):
    return RoundCosts(tuple([0.0] + list(verify)), tuple([0.0] + list(draft)))


def test_expected_tokens_matches_enumeration():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 4, generator=g)
    exp = budget.expected_tokens(a)
    for k in range(5):  # enumerate every accept/reject pattern of the first k drafts
        total = 0.0
        for row in a.tolist():
            for pattern in itertools.product([0, 1], repeat=k):
                p = 1.0
                for ai, acc in zip(row, pattern):
                    p *= ai if acc else 1 - ai
                accepted = next((i for i, acc in enumerate(pattern) if not acc), k)
                total += p * (1 + accepted)
        assert exp[k].item() == pytest.approx(total, rel=1e-5)


def test_interpolate_is_linear_between_measured_sizes_and_flat_beyond():
    assert budget.interpolate({1: 10.0, 4: 40.0}, 6) == (0.0, 10.0, 20.0, 30.0, 40.0, 40.0, 40.0)
    assert budget.interpolate({2: 5.0}, 3) == (0.0, 5.0, 5.0, 5.0)


def test_verify_length_follows_costs_and_confidence():
    flat = costs([10.0] * 9, [1.0] * 8)  # verifying more costs nothing: verify all that may be right
    assert budget.best_verify_length(torch.full((1, 8), 0.9), flat, 8) == 8
    linear = costs([10.0 * t for t in range(1, 10)], [1.0] * 8)  # each token costs a full step
    assert budget.best_verify_length(torch.full((1, 8), 0.5), linear, 8) == 0
    steps = costs([10.0, 11.0, 12.0, 13.0, 30.0, 31.0, 32.0, 33.0, 34.0], [1.0] * 8)
    # confident drafts until the cost jumps at 5 tokens: stop before the jump
    assert budget.best_verify_length(torch.full((2, 8), 0.8), steps, 8) == 3
    # a confident prefix, then a draft the drafter doubts: stop at the doubt
    a = torch.tensor([[0.95, 0.95, 0.05, 0.95, 0.95, 0.95, 0.95, 0.95]])
    sloped = costs([10.0 + 0.5 * t for t in range(1, 10)], [1.0] * 8)
    assert budget.best_verify_length(a, sloped, 8) == 2
    assert budget.best_verify_length(a, sloped, 1) == 1  # never beyond what was drafted


def test_verify_length_is_a_stopping_rule():
    """Whether draft i is verified must not depend on draft i + 1's confidence (exactness
    of rejection sampling): changing the confidences after the chosen k + 1 changes nothing."""
    g = torch.Generator().manual_seed(1)
    c = costs([10.0 + 3.0 * t for t in range(9)], [2.0] * 8)
    for _ in range(200):
        a = torch.rand(1, 8, generator=g)
        k = budget.best_verify_length(a, c, 8)
        b = a.clone()
        b[:, k + 1:] = torch.rand(1, 8 - k - 1, generator=g) if k + 1 < 8 else b[:, k + 1:]
        assert budget.best_verify_length(b, c, 8) == k


def test_draft_length_grows_with_acceptance():
    c = costs([10.0 + 1.0 * t for t in range(9)], [2.0 + 1.0 * n for n in range(1, 9)])
    assert budget.best_draft_length([0.0] * 8, c) == 0
    assert budget.best_draft_length([0.99] * 8, c) == 8
    mid = budget.best_draft_length([0.6] * 8, c)
    assert 0 < mid < 8


def test_draft_length_drafts_only_past_a_margin_over_a_plain_step():
    """A plain step: 1 token in 10 ms. One draft verified: 1 + a tokens in 12 ms. Drafting is
    chosen only when its expected tokens per millisecond beat the plain step's by more than
    the margin (the plan's estimate is biased upwards when it acts: budget.DRAFT_MARGIN)."""
    c = costs([10.0, 10.0], [2.0])
    five_percent, twenty_percent = 0.26, 0.44  # (1 + a) / 12 against 1 / 10
    assert budget.best_draft_length([five_percent], c, margin=0.0) == 1
    assert budget.best_draft_length([five_percent], c, margin=0.1) == 0
    assert budget.best_draft_length([twenty_percent], c, margin=0.1) == 1
    assert budget.best_draft_length([twenty_percent], c, margin=0.25) == 0
    assert 0.0 < budget.DRAFT_MARGIN < 0.25
    assert budget.best_draft_length([five_percent], c) == 0 and budget.best_draft_length([twenty_percent], c) == 1
    # the margin decides only whether to draft, not how many: among n > 0 the fastest
    c = costs([10.0, 10.0, 10.0, 13.0], [1.0, 1.0, 1.0])
    assert budget.best_draft_length([0.9, 0.9, 0.1], c) == budget.best_draft_length([0.9, 0.9, 0.1], c, margin=0.0) == 2


def test_measured_drafting_includes_the_context_extension_and_calibration(monkeypatch):
    """Every timed drafting (warm-up included) extends the drafter's context first and
    calibrates its confidences after, as a drafting round does, and leaves the context as it
    found it: each size is timed over the same context, at each of the two cache lengths."""
    gen = tiny_generator("qwen3")
    events, lengths = [], []
    extend, draft, calibrate = gen.drafter.extend_context, gen.drafter.draft, gen.drafter.calibration

    def counting_extend(cache, *a):
        events.append("extend")
        return extend(cache, *a)

    def counting_draft(cache, *a, **kw):
        events.append("draft")
        lengths.append(cache.length)
        return draft(cache, *a, **kw)

    def counting_calibration(confidence):
        events.append("calibrate")
        return calibrate(confidence)

    monkeypatch.setattr(gen.drafter, "extend_context", counting_extend)
    monkeypatch.setattr(gen.drafter, "draft", counting_draft)
    monkeypatch.setattr(gen.drafter, "calibration", counting_calibration)
    costs = budget.measure_round_costs(gen, 2, contexts=(16, 40), repeats=2)
    drafts = events.count("draft")
    assert drafts > 0 and events[:2] == ["extend", "extend"]  # each context's prompt
    assert events[2:] == ["extend", "draft", "calibrate"] * drafts
    assert sorted(set(lengths)) == [16 + budget._KEPT_PER_ROUND, 40 + budget._KEPT_PER_ROUND]
    assert (costs.context, costs.long_context) == (16, 40)
    assert len(costs.verify_ms_long) == len(costs.verify_ms) and len(costs.draft_ms_long) == len(costs.draft_ms)
    with pytest.raises(ValueError, match="contexts"):
        budget.measure_round_costs(gen, 1, contexts=(64, 16))


def test_costs_follow_the_cache_length_linearly():
    short = costs([10.0, 12.0, 14.0], [2.0, 3.0])
    c = RoundCosts(short.verify_ms, short.draft_ms, 1, "k", 100, 1100, (0.0, 20.0, 30.0, 44.0), (0.0, 4.0, 7.0))
    assert c.at(100).verify_ms == short.verify_ms and c.at(100).draft_ms == short.draft_ms
    assert c.at(1100).verify_ms == c.verify_ms_long and c.at(1100).draft_ms == c.draft_ms_long
    assert c.at(600).verify_ms == pytest.approx((0.0, 15.0, 21.0, 29.0))
    assert c.at(600).draft_ms == pytest.approx((0.0, 3.0, 5.0))
    assert c.at(2100).verify_ms == pytest.approx((0.0, 30.0, 48.0, 74.0))  # beyond: the same line
    assert c.at(0).verify_ms == short.verify_ms and c.at(0).draft_ms == short.draft_ms  # below: the shorter's
    assert c.at(600).round_ms(1, 1) == pytest.approx(3.0 + 21.0)
    assert short.at(5000) is short  # one context measured: the same costs at every length
    assert RoundCosts.from_json(c.to_json()) == c
    assert RoundCosts.from_json(short.to_json()) == short
    d = json.loads(c.to_json())
    for bad in ({"verify_ms_long": [1.0]}, {"verify_ms_long": [1.0, "x", 2.0, 3.0]},
                {"draft_ms_long": [0.0, 1.0]}, {"long_context": 50}, {"context": -1}, {"long_context": True},
                {"draft_ms_long": [0.0, 1.0, 7.0]}):  # below the short context's 2.0
        with pytest.raises(ValueError, match="round costs"):
            RoundCosts.from_json(json.dumps({**d, **bad}))


def test_generation_plans_with_the_costs_at_its_cache_length():
    """Costs under which drafting pays at a short cache and not at a long one: a short prompt's
    rounds draft, a long prompt's are plain steps (the costs read at each round's own cache
    length, not the measurement's)."""
    gen = tiny_generator("qwen3")
    cheap = (0.0, 20.0) + tuple(10.0 + 0.05 * t for t in range(2, 33))
    dear = (0.0, 20.0) + tuple(1000.0 * t for t in range(2, 33))
    gen._costs[1] = RoundCosts(cheap, (0.0,) + (0.05,) * 15, 1, "", 10, 300, dear, (0.0,) + (1000.0,) * 15)
    ids = torch.randint(1, 64, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    short = gen.generate(ids[:8], max_new_tokens=12, tree=None)
    long = gen.generate(ids, max_new_tokens=12, tree=None)
    assert max(short.verified_lengths) > 1
    assert set(long.verified_lengths) == {1}


@pytest.mark.parametrize("batch_size,sizes", [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (4, (1, 2, 4)),
                                               (5, (1, 2, 4, 5)), (64, (1, 2, 4, 8, 16, 32, 64)),
                                               (100, (1, 2, 4, 8, 16, 32, 64, 100))])
def test_a_call_plans_with_its_own_batch_size_and_the_powers_of_two_below(batch_size, sizes):
    """The costs a call measures: its batch size and the powers of two below it; a round of
    r rows reads the smallest of them at or above r (never a table of fewer rows)."""
    assert budget.cost_batch_sizes(batch_size) == sizes
    for rows in range(1, batch_size + 1):
        size = budget.cost_batch_size(rows, batch_size)
        assert size in sizes and size >= rows and not any(rows <= s < size for s in sizes)


@pytest.mark.parametrize("args,name", [((0, 4), "rows"), ((5, 4), "rows"), ((True, 4), "rows"), ((1, 0), "batch_size"),
                                       ((1, 2.0), "batch_size")])
def test_cost_batch_size_names_a_bad_argument(args, name):
    with pytest.raises(ValueError, match=name):
        budget.cost_batch_size(*args)


def test_depth_acceptance_counts_only_reached_depths():
    d = DepthAcceptance(4, prior=0.5, prior_weight=2.0)
    d.update([4, 4, 2], [4, 1, 0])  # all accepted; first accepted then rejected; first rejected
    assert d.tried == [5.0, 4.0, 3.0, 3.0]
    assert d.accepted == [3.0, 2.0, 2.0, 2.0]


def test_depth_acceptance_forgets_back_to_the_prior():
    """Evidence fades by 1 - 1/memory a round: after a run of rejections the plan stops
    drafting, and rounds that draft nothing bring the rates back to the prior, so a later
    round drafts (and measures) again."""
    c = costs([10.0, 10.5, 11.0, 11.5], [2.0, 2.2, 2.4, 2.6])
    d = DepthAcceptance(1, prior=0.6, prior_weight=4.0, memory=8.0)  # plans 0 or 1 draft
    assert budget.best_draft_length(d.rates(), c) > 0
    for _ in range(20):
        d.update([1], [0])  # the first draft rejected every round
    assert d.rates()[0] < 0.25  # 4 prior rounds at 0.6 against ~8 remembered rejections
    assert budget.best_draft_length(d.rates(), c) == 0
    rounds = 0
    while budget.best_draft_length(d.rates(), c) == 0:
        d.update([0], [0])  # plain steps: nothing verified
        rounds += 1
        assert rounds < 100
    assert rounds > 2  # not at once: the rejections still weigh for a while
    for _ in range(200):
        d.update([0], [0])
    assert d.rates() == pytest.approx([0.6])
    # without rounds, nothing changes; an update's own counts are added after the fading
    e = DepthAcceptance(2, prior=0.5, prior_weight=2.0, memory=4.0)
    e.update([2], [2])
    assert e.tried == [3.0, 3.0] and e.accepted == [2.0, 2.0]
    e.update([0], [0])
    assert e.tried == pytest.approx([2.75, 2.75]) and e.accepted == pytest.approx([1.75, 1.75])


def test_calibration_fit_is_monotone_and_recovers_rates():
    g = torch.Generator().manual_seed(2)
    conf = torch.rand(20000, generator=g)
    accepted = torch.rand(20000, generator=g) < conf ** 2  # the drafter is overconfident
    cal = Calibration.fit(conf.tolist(), accepted.tolist(), bins=10)
    assert all(x <= y for x, y in zip(cal.rates, cal.rates[1:]))
    probe = torch.tensor([0.15, 0.55, 0.95])
    assert cal(probe).tolist() == pytest.approx((probe ** 2).tolist(), abs=0.06)
    assert Calibration()(probe).tolist() == pytest.approx(probe.tolist())  # identity when not fitted


def test_calibration_pools_violators_and_round_trips(tmp_path):
    cal = Calibration.fit([0.1, 0.2, 0.3, 0.4], [True, False, True, False], bins=4, prior=0.0)
    assert all(x <= y for x, y in zip(cal.rates, cal.rates[1:]))
    cal.save(tmp_path / "c.json")
    again = Calibration.load(tmp_path / "c.json")
    assert (again.edges, again.rates) == (cal.edges, cal.rates)
    assert Calibration.load(tmp_path / "missing.json").edges == []


def fast_counted_measurements(monkeypatch) -> list[int]:
    """Round-cost measurements over a short context, one repeat; the batch size of each is
    appended to the returned list."""
    calls, real = [], budget.measure_round_costs

    def counting(g, batch_size=1, **kw):
        calls.append(batch_size)
        return real(g, batch_size, contexts=(16, 48), repeats=1)

    monkeypatch.setattr(budget, "measure_round_costs", counting)
    return calls


def test_round_costs_are_measured_once_and_cached_per_configuration(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "cost_cache_dir", lambda: tmp_path / "round_costs")
    gen = tiny_generator("qwen3")
    calls = fast_counted_measurements(monkeypatch)
    first = budget.round_costs(gen, 2)
    n = gen.drafter.config.num_drafts
    assert len(first.verify_ms) == max(n + 2, 33) and len(first.draft_ms) == n + 1  # trees verify up to 32
    assert all(t > 0 for t in first.verify_ms[1:]) and all(t > 0 for t in first.draft_ms[1:])
    assert budget.round_costs(gen, 2) == first and calls == [2]  # from the disk cache
    files = list((tmp_path / "round_costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["batch_size"] == 2
    budget.round_costs(gen, 3)  # another batch size: measured
    gen.drafter.set_draft_vocab(torch.arange(32))  # another draft vocabulary: another key
    assert budget.cost_key(gen, 2) != first.key
    gen.drafter.set_draft_vocab(None)
    assert budget.cost_key(gen, 2) == first.key
    with monkeypatch.context() as m:
        m.setattr(budget, "kernels_fingerprint", lambda: "rebuilt")  # other kernels: another key
        assert budget.cost_key(gen, 2) != first.key
    with monkeypatch.context() as m:
        m.setattr(budget, "python_fingerprint", lambda: "edited")  # other Python sources: another key
        assert budget.cost_key(gen, 2) != first.key
    with domino_ops.cpu.kernel_switch("DOMINO_SMALL_BATCH_ATTENTION_SCORES", "vector"):  # forced: another key
        assert budget.cost_key(gen, 2) != first.key
    for isa in set(domino_ops.cpu.supported_isas()) - {domino_ops.cpu.isa()}:  # another build forced: another key
        with domino_ops.cpu.forced_isa(isa):
            assert budget.cost_key(gen, 2) != first.key
    assert budget.cost_key(gen, 2) == first.key
    use_small_batch_linear(gen.drafter)  # a drafter on other kernels: another key, each switch
    linear_key = budget.cost_key(gen, 2)
    use_fused_layers(gen.drafter)
    fused_key = budget.cost_key(gen, 2)
    assert len({first.key, linear_key, fused_key}) == 3
    undo_fused_layers(undo_small_batch_linear(gen.drafter))
    assert budget.cost_key(gen, 2) == first.key
    gen.target.to(torch.bfloat16)  # another dtype: another key
    assert budget.cost_key(gen, 2) != first.key
    assert calls == [2, 3]


def test_sources_fingerprint_follows_every_file_and_falls_back_to_the_version(tmp_path):
    import types

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "sub" / "mod.py").write_text("y = 2\n")
    module = types.ModuleType("pkg")
    module.__file__ = str(pkg / "__init__.py")
    before = budget.sources_fingerprint([module])
    assert budget.sources_fingerprint([module]) == before
    (pkg / "sub" / "mod.py").write_text("y = 3\n")  # a nested file edited: another hash
    edited = budget.sources_fingerprint([module])
    assert edited != before
    # bytes moved from the end of one file to the start of the next: another hash
    (pkg / "__init__.py").write_text("x = 1\ny")
    (pkg / "sub" / "mod.py").write_text(" = 3\n")
    assert budget.sources_fingerprint([module]) != edited
    module.__file__ = None  # no folder of sources (a namespace or frozen package): the version
    assert budget.sources_fingerprint([module]) == budget.sources_fingerprint([types.ModuleType("pkg")])


def test_depth_rates_from_the_fit_seed_the_plan():
    conf = [0.9, 0.9, 0.8, 0.2, 0.3]
    acc = [True, True, False, False, False]
    depth = [0, 0, 1, 0, 1]
    cal = Calibration.fit(conf, acc, bins=2, depth=depth)
    assert cal.depth_rates == pytest.approx([2.5 / 4, 0.5 / 3])
    d = DepthAcceptance(4, cal.depth_rates)
    assert d.rates() == pytest.approx([2.5 / 4, 0.5 / 3, 0.5 / 3, 0.5 / 3])


def test_path_acceptance_is_the_product_along_each_path():
    """With the identity calibration a candidate's path probability is its cumulative draft
    probability; a calibration scales every node on the path."""
    from domino.tree import path_acceptance
    from domino_ops.tree_draft import draft_tree
    from kernel_cases import head_rollout_inputs

    inputs = head_rollout_inputs(2, 4, 40, 8, 12, 4, torch.float32, torch.float32, True, seed=3)
    tree = draft_tree(*inputs, torch.tensor([1, 2]), topk=3, depth=3)
    ident = path_acceptance(tree, 3, 3, Calibration())
    torch.testing.assert_close(ident, tree.candidate_scores.exp(), rtol=1e-5, atol=1e-6)
    half = path_acceptance(tree, 3, 3, lambda c: c * 0.5)  # each node's own probability halved
    depth_of = torch.tensor([0] * 3 + [1] * 9 + [2] * 9)
    torch.testing.assert_close(half, ident * 0.5 ** (depth_of + 1), rtol=1e-5, atol=1e-6)
    # A calibration that is not multiplicative: the product no longer telescopes to the
    # cumulative score, so only the right parent of every node gives it. Walked by hand
    # from the EAGLE layout: step s >= 1's candidate c (flat) hangs under frontier slot
    # (c - tree_size(s)) // topk, the node parent_list[1 + topk * (s - 1) + slot].
    cal = Calibration(edges=[0.2, 0.5, 0.8, 1.0], rates=[0.05, 0.3, 0.6, 0.9])
    got = path_acceptance(tree, 3, 3, cal)
    scores, plist = tree.candidate_scores.tolist(), tree.parent_list.tolist()
    for b in range(2):
        for c in range(21):
            prob, node = 1.0, c
            while node >= 0:
                s = 0 if node < 3 else 1 if node < 12 else 2
                parent = -1 if s == 0 else plist[b][1 + 3 * (s - 1) + (node - (3 if s == 1 else 12)) // 3]
                own = torch.tensor(scores[b][node] - (scores[b][parent] if parent >= 0 else 0.0)).exp()
                prob *= float(cal(own))
                node = parent
            assert float(got[b, c]) == pytest.approx(prob, rel=1e-5, abs=1e-7), (b, c)


def test_tree_size_follows_costs():
    scores = torch.log(torch.tensor([[0.9, 0.5, 0.3, 0.1]]))
    paths = scores.exp()
    flat = costs([10.0] * 8, [1.0] * 4)
    assert budget.best_tree_size(paths, scores, flat, 5.0, max_nodes=5) == 5  # every node is free
    steep = costs([10.0 * t for t in range(1, 9)], [1.0] * 4)
    assert budget.best_tree_size(paths, scores, steep, 5.0, max_nodes=5) == 2  # the smallest tree
    mid = costs([10.0, 10.0, 10.5, 11.0, 20.0, 21.0, 22.0, 23.0], [1.0] * 4)
    # the first three candidates are worth their cost, the jump at 5 nodes is not
    assert budget.best_tree_size(paths, scores, mid, 5.0, max_nodes=5) == 4


def test_measured_costs_ignore_a_disturbed_small_size():
    # other load only adds time: a size timed slower than a larger one was disturbed and
    # must not raise the larger sizes (a running maximum did, and the budget stopped drafting)
    assert budget._nondecreasing((0.0, 17.6, 24.7, 18.0, 18.2, 30.0, 19.0)) == (0.0, 17.6, 18.0, 18.0, 18.2, 19.0, 19.0)
    assert budget._nondecreasing((1.0, 2.0, 3.0)) == (1.0, 2.0, 3.0)


@pytest.mark.parametrize("content", ["null", "[]", '{"verify_ms": null, "draft_ms": [0, 1]}',
                                     '{"verify_ms": [], "draft_ms": []}', '{"verify_ms": [0, "x"], "draft_ms": [0, 1]}',
                                     "{", ""])
def test_a_corrupt_cost_file_is_measured_again(tmp_path, monkeypatch, content):
    monkeypatch.setattr(budget, "cost_cache_dir", lambda: tmp_path)
    gen = tiny_generator("qwen3")
    calls = fast_counted_measurements(monkeypatch)
    (tmp_path / f"{budget.cost_key(gen, 1)}.json").write_text(content)
    costs = budget.round_costs(gen, 1)
    assert calls == [1] and costs.max_drafts >= gen.drafter.config.num_drafts
    assert budget.round_costs(gen, 1) == costs and calls == [1]  # the rewritten file serves now


def test_an_unwritable_cost_cache_warns_and_still_serves(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(budget, "cost_cache_dir", lambda: blocker / "round_costs")  # under a file: mkdir fails
    gen = tiny_generator("qwen3")
    calls = fast_counted_measurements(monkeypatch)
    with pytest.warns(RuntimeWarning, match="could not store the round costs"):
        costs = budget.round_costs(gen, 1)
    assert calls == [1] and costs.max_drafts >= gen.drafter.config.num_drafts


def test_round_cost_timings_interleave_the_sizes_and_keep_each_fastest(monkeypatch):
    """_min_ms times the sizes in rounds (every size once per round, so a slow stretch of the
    machine hits them alike), skips the first round (warm-up) and keeps each size's fastest
    call; ``before`` runs untimed before every call."""
    now = [0.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: now[0])
    durations_ms = {1: [100.0, 5.0, 4.0, 6.0], 8: [100.0, 9.0, 30.0, 7.0]}  # warm-up, then 3 repeats
    order = []

    def call(key):
        order.append(key)
        now[0] += durations_ms[key][sum(1 for k in order if k == key) - 1] / 1e3

    def before():
        order.append("before")
        now[0] += 1.0  # untimed: must not count

    best = budget._min_ms({k: functools.partial(call, k) for k in durations_ms}, 3, before=before)
    assert order == ["before", 1, "before", 8] * 4
    assert best == pytest.approx({1: 4.0, 8: 7.0})


def test_tree_tokens_are_what_best_tree_size_maximises():
    scores = torch.log(torch.tensor([[0.9, 0.5, 0.3, 0.1], [0.8, 0.7, 0.2, 0.05]]))
    paths = torch.tensor([[0.2, 0.6, 0.1, 0.4], [0.5, 0.1, 0.3, 0.2]])  # not in the scores' order
    tokens = budget.tree_tokens(paths, scores)
    # N - 1 kept: each sequence's best N - 1 by score (EAGLE-2's selection), their path
    # probabilities summed, plus each sequence's bonus token
    by_score = paths.gather(1, scores.argsort(dim=1, descending=True))
    want = [2.0] + [2.0 + float(by_score[:, :k].sum()) for k in range(1, 5)]
    assert tokens == pytest.approx(want)
    assert tokens[1] == pytest.approx(2.0 + 0.2 + 0.5)
    mid = costs([10.0, 10.0, 10.5, 11.0, 20.0, 21.0, 22.0, 23.0], [1.0] * 4)
    N = budget.best_tree_size(paths, scores, mid, 5.0, max_nodes=5)
    assert N == max(range(2, 6), key=lambda n: tokens[n - 1] / (5.0 + mid.verify(n)))


def test_graft_gain_multiplies_the_conditional_rates():
    rates = [0.5, 0.8, 0.9]
    assert budget.graft_gain([3], [rates], 0) == 0.0
    assert budget.graft_gain([3], [rates], 2) == pytest.approx(0.5 + 0.5 * 0.8)
    # each sequence gains up to its own new tokens, at its own rates; a length past the rates gains nothing more
    assert budget.graft_gain([1, 3], [rates, rates], 5) == pytest.approx(0.5 + (0.5 + 0.4 + 0.36))
    assert budget.graft_gain([2, 2], [rates, [0.1, 0.1]], 2) == pytest.approx((0.5 + 0.4) + (0.1 + 0.01))


def test_graft_length_follows_costs_and_rates():
    rates = [0.5] + [0.9] * 9
    flat = costs([10.0] * 32, [1.0] * 4)
    assert budget.best_graft_length([10], [rates], 2.0, 6, flat, 5.0) == 10  # verification is free: the whole chain
    # every node costs what the tree's 6 nodes cost on average, for less than they gain each
    steep = costs([100.0 * t for t in range(1, 33)], [1.0] * 4)
    assert budget.best_graft_length([10], [rates], 5.0, 6, steep, 5.0) == 0
    # 2 ms a node against ~0.08 tokens/ms now: the chain's head pays, its tail (0.5 * 0.7^j) not
    ramp = costs([20.0 + 2.0 * t for t in range(1, 33)], [1.0] * 4)
    L = budget.best_graft_length([10], [[0.5] + [0.7] * 9], 3.0, 6, ramp, 5.0)
    assert 0 < L < 10
    assert budget.best_graft_length([10], [[0.05] * 10], 3.0, 6, ramp, 5.0) == 0  # a chain that is rarely right
    # a likely chain beside an unlikely one in the batch: grafted, since the forward is shared
    assert budget.best_graft_length([10, 10], [[0.9] * 10, [0.05] * 10], 3.0, 6, ramp, 5.0) > 0
    # never past the measured verification sizes (32 here), where verify() is flat
    assert budget.best_graft_length([10], [rates], 2.0, 28, flat, 5.0) == 4
    assert budget.best_graft_length([10], [rates], 2.0, 40, flat, 5.0) == 0
    assert budget.best_graft_length([], [], 2.0, 6, ramp, 5.0) == 0
    assert budget.best_graft_length([0, 0], [rates, rates], 2.0, 6, ramp, 5.0) == 0
