"""Retrieval drafting from a datastore of the target's outputs (domino.datastore): proposals
against a brute-force scan of the corpus, hash collisions that must not propose, the
file round trip, bad input, and the engine's output still exactly the target's greedy
decoding with the chains grafted."""

import os
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import domino.datastore as ds
import domino.generate
from domino import TreeShape
from domino.datastore import CACHED_INDEXES_KEPT, TokenDatastore
from engine_cases import cheap_verification, count_grafts, prompts
from tiny_models import tiny_generator


def brute_force_proposal(sequences, context, max_tokens, sizes, max_matches, min_share):
    """The majority walk from the first ``max_matches`` occurrences, in corpus order, of
    the longest suffix of ``context`` among ``sizes`` found inside one sequence."""
    for n in sorted(sizes, reverse=True):
        if len(context) < n or max_tokens == 0:
            continue
        suffix = list(context[-n:])
        occ = [(s, i + n) for s, seq in enumerate(sequences) for i in range(len(seq) - n + 1) if seq[i:i + n] == suffix]
        if not occ:
            continue
        occ = occ[:max_matches]
        out = []
        while len(out) < max_tokens:
            following = [sequences[s][j] if j < len(sequences[s]) else -1 for s, j in occ]  # -1: it ends
            counts = {t: following.count(t) for t in set(following) if t != -1}
            if not counts:
                break
            token = min(counts, key=lambda t: (-counts[t], t))  # most frequent, then the smallest id
            if counts[token] < min_share * len(following):
                break
            out.append(token)
            occ = [(s, j + 1) for (s, j), t in zip(occ, following) if t == token]
        return out
    return []


sequences_st = st.lists(st.lists(st.integers(0, 3), max_size=14), max_size=6)


@pytest.mark.parametrize("max_matches", [ds.MAX_MATCHES, 2])
@given(sequences=sequences_st, context=st.lists(st.integers(0, 3), max_size=10), max_tokens=st.integers(0, 6),
       sizes=st.sets(st.integers(1, 5), min_size=1, max_size=3))
def test_proposal_matches_a_brute_force_scan(max_matches, sequences, context, max_tokens, sizes):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds, "MAX_MATCHES", max_matches)
        store = TokenDatastore.from_sequences(sequences, sizes)
        want = brute_force_proposal(sequences, context, max_tokens, sizes, max_matches, ds.MIN_SHARE)
        assert store.propose(context, max_tokens) == want


@given(sequences=sequences_st, context=st.lists(st.integers(0, 3), min_size=2, max_size=8))
def test_hash_collisions_never_propose(sequences, context):
    """With a multiplier of 1 the hash is the sum of the tokens, so [1, 2] and [2, 1]
    collide: every hit is checked against the tokens, and the proposal stays the scan's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds, "_MULT", 1)
        store = TokenDatastore.from_sequences(sequences, (2, 1))
        assert store.propose(context, 4) == brute_force_proposal(sequences, context, 4, (2, 1), ds.MAX_MATCHES,
                                                                ds.MIN_SHARE)


def test_proposal_has_teeth():
    store = TokenDatastore.from_sequences([[5, 1, 2, 3, 4, 9], [7, 1, 2, 3, 4, 8], [1, 2, 3, 4, 8, 8]], (4, 2))
    # [1, 2, 3, 4] goes on with 9 once and 8 twice: 8. Of the two followed, one ends there
    # and one goes on with 8: half of them, MIN_SHARE: 8. Then only the end follows.
    assert store.propose([0, 1, 2, 3, 4], 3) == [8, 8]
    assert store.propose([0, 1, 2, 3, 4], 1) == [8]
    assert store.propose([9, 9, 3, 2], 5) == []  # neither [9, 9, 3, 2] nor [3, 2] occurs
    assert store.propose([9, 9, 2, 3], 5) == [4, 8, 8]  # the 2-gram [2, 3]: 4 (3 of 3), then as above
    # below MIN_SHARE: 5 follows one of three, each of the others another token
    assert TokenDatastore.from_sequences([[1, 2, 5], [1, 2, 6], [1, 2, 7]], (2,)).propose([1, 2], 3) == []
    assert store.propose([6, 6, 6, 1, 2], 1) == [3]  # the 2-gram [1, 2]: all three go on with 3
    assert store.propose([1, 2, 3, 4], 0) == []
    # 8 (2 of 3), 8 (2 of 2), then 8 against 7: a tie, the smaller id wins with half, which
    # is MIN_SHARE: 7; then only the end of the sequence follows
    store = TokenDatastore.from_sequences([[1, 2, 3, 4, 8, 8, 8], [1, 2, 3, 4, 8, 8, 7], [1, 2, 3, 4, 9]], (4,))
    assert store.propose([1, 2, 3, 4], 5) == [8, 8, 7]
    # a chain never runs into the next sequence
    assert TokenDatastore.from_sequences([[1, 2, 3], [4, 5]], (2,)).propose([2, 3], 4) == []


@pytest.mark.parametrize("top_id", [49_151, 65_534, 65_535, 100_000])  # from 65535 up: stored as int32
def test_save_and_load_round_trip(tmp_path, top_id):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, top_id + 1, size=rng.integers(0, 30)).tolist() for _ in range(20)] + [[top_id] * 5]
    store = TokenDatastore.from_sequences(seqs)
    store.save(tmp_path / "d")  # written under the name given
    back = TokenDatastore.load(tmp_path / "d")
    assert np.array_equal(back.tokens, store.tokens) and back.sizes == store.sizes
    for s in seqs:
        assert back.propose(s[:8], 5) == store.propose(s[:8], 5)


def test_cached_index_is_the_built_one(tmp_path):
    """A load with ``index_dir`` builds and keeps the index once, then maps the same keys;
    another corpus or other sizes get their own."""
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 6, size=rng.integers(1, 40)).tolist() for _ in range(30)]
    built = TokenDatastore.from_sequences(seqs, (5, 3))
    built.save(tmp_path / "d.npz")
    first = TokenDatastore.load(tmp_path / "d.npz", (5, 3), index_dir=tmp_path / "idx")
    again = TokenDatastore.load(tmp_path / "d.npz", (5, 3), index_dir=tmp_path / "idx")
    assert len(list((tmp_path / "idx").iterdir())) == 1
    assert all(isinstance(again._index[n], np.memmap) for n in (5, 3))
    for n in (5, 3):
        assert np.array_equal(first._index[n], built._index[n]) and np.array_equal(again._index[n], built._index[n])
    for s in seqs:
        assert again.propose(s[:6], 4) == built.propose(s[:6], 4)
    TokenDatastore.load(tmp_path / "d.npz", (4,), index_dir=tmp_path / "idx")
    assert len(list((tmp_path / "idx").iterdir())) == 2
    assert not list((tmp_path / "idx").glob("*.tmp"))


def test_cached_indexes_are_bounded_least_recently_used_first(tmp_path):
    """A new index evicts the least recently used beyond CACHED_INDEXES_KEPT; a load counts
    as a use, and an evicted datastore is rebuilt, right, when loaded again."""
    rng = np.random.default_rng(2)
    corpora = [TokenDatastore.from_sequences([rng.integers(0, 9, size=30).tolist() for _ in range(5)], (4,))
               for _ in range(3)]
    idx = tmp_path / "idx"
    a = TokenDatastore(corpora[0].tokens, (4,), index_dir=idx)
    (dir_a,) = idx.iterdir()
    TokenDatastore(corpora[1].tokens, (4,), index_dir=idx)
    (dir_b,) = set(idx.iterdir()) - {dir_a}
    old = time.time() - 100
    os.utime(dir_a, (old, old))
    os.utime(dir_b, (old + 10, old + 10))
    assert isinstance(TokenDatastore(corpora[0].tokens, (4,), index_dir=idx)._index[4], np.memmap)  # a used again
    TokenDatastore(corpora[2].tokens, (4,), index_dir=idx)  # a new index: b, the least recently used, goes
    assert CACHED_INDEXES_KEPT == 2 and len(list(idx.iterdir())) == 2
    assert dir_a.exists() and not dir_b.exists()
    b_again = TokenDatastore(corpora[1].tokens, (4,), index_dir=idx)  # rebuilt
    assert np.array_equal(b_again._index[4], corpora[1]._index[4])
    assert np.array_equal(a._index[4], corpora[0]._index[4])


@pytest.mark.parametrize("tokens,match", [(np.zeros((2, 3), np.int64), "1-D integer"),
                                          (np.array([1.0, 2.0]), "1-D integer"),
                                          (np.array([3, -2, 1]), ">= 0 or -1")])
def test_bad_tokens(tokens, match):
    with pytest.raises(ValueError, match=match):
        TokenDatastore(tokens)


@pytest.mark.parametrize("sizes", [(), (0, 2), (-1,)])
def test_bad_sizes(sizes):
    with pytest.raises(ValueError, match="sizes must be n-gram lengths >= 1"):
        TokenDatastore.from_sequences([[1, 2, 3]], sizes)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_bad_max_tokens(bad):
    with pytest.raises(ValueError, match="max_tokens must be an int >= 0"):
        TokenDatastore.from_sequences([[1, 2, 3]]).propose([1, 2], bad)


@pytest.mark.parametrize("kind,batch,shape", [("qwen3", 1, TreeShape(2, 3)), ("llama", 3, TreeShape(3, 2, 5))])
@pytest.mark.parametrize("corpus", ["own outputs", "noise"])
def test_engine_with_a_datastore_is_plain_greedy_and_grafts(kind, batch, shape, corpus, monkeypatch):
    """Chains from the target's own outputs (mostly right) and from the same outputs with
    a third of their tokens replaced at random (often wrong) are grafted, and the output
    is still the target's greedy decoding."""
    gen = tiny_generator(kind)
    cheap_verification(gen, batch)
    ps = prompts(batch, seed=5)
    plain = gen.generate_target_only(ps, max_new_tokens=40).token_ids
    seqs = gen.generate_target_only(prompts(6, seed=6), max_new_tokens=40).token_ids + plain  # others', these
    if corpus == "noise":
        rng = np.random.default_rng(0)
        seqs = [[int(rng.integers(2, 64)) if rng.random() < 1 / 3 else t for t in seq] for seq in seqs]
    gen.datastore = TokenDatastore.from_sequences(seqs, (4, 3))
    grafted = count_grafts(monkeypatch)
    spec = gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=0, datastore_tokens=5)
    assert spec.token_ids == plain
    assert sum(grafted) > 0 and all(g <= 5 for g in grafted)
    grafted.clear()
    alone = gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=0, datastore_tokens=0)
    if corpus == "own outputs":  # the chains hold these outputs: they are accepted, from the right context
        assert spec.mean_acceptance_length > alone.mean_acceptance_length + 1
    grafted.clear()
    assert gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=3, datastore_tokens=5).token_ids == plain
    grafted.clear()
    assert gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=0, datastore_tokens=0).token_ids == plain
    assert not grafted  # off: nothing grafted


def test_bad_datastore_arguments():
    gen = tiny_generator("qwen3")  # a vocabulary of 64
    with pytest.raises(ValueError, match="datastore: holds token id 64, but the target's vocabulary has 64"):
        domino.generate.DominoGenerator(gen.target, gen.drafter, gen.tokenizer,
                                        datastore=TokenDatastore.from_sequences([[1, 64, 2]]))
    with pytest.raises(ValueError, match="datastore_tokens must be an int >= 0"):
        gen.generate(prompts(1), max_new_tokens=4, datastore_tokens=-2)
    with pytest.raises(TypeError, match="datastore must be a domino.datastore.TokenDatastore"):
        domino.generate.DominoGenerator(gen.target, gen.drafter, gen.tokenizer, datastore=[1, 2, 3])


def test_build_datastore_leaves_out_the_held_out_prompts_in_every_pass(tmp_path):
    """build_datastore.responses: the held-out shard, and a later pass's shard holding its
    prompts again (generate_data --passes), never enter the datastore."""
    import json

    from training.build_datastore import responses

    def shard(i, prompts, response):
        lines = [json.dumps({"prompt_ids": p, "response_ids": [response, i]}) for p in prompts]
        (tmp_path / f"shard_{i:05d}.jsonl").write_text("\n".join(lines) + "\n")

    shard(0, [[1, 2], [3]], 10)  # held out
    shard(1, [[4], [5, 6]], 11)
    shard(2, [[3], [7]], 12)  # pass 2: holds a held-out prompt
    shard(3, [[4], [5, 6]], 13)  # pass 2 of shard 1
    assert responses(tmp_path, 4, {0}) == [[11, 1], [11, 1], [13, 3], [13, 3]]
    assert responses(tmp_path, 2, {0}) == [[11, 1], [11, 1]]
    assert len(responses(tmp_path, 4, set())) == 8
