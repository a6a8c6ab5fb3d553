"""Engine requests are validated before any work: each error names the argument."""

import pytest
import torch

import domino
from domino import DominoGenerator, SamplingParams, TreeShape
from tiny_models import IdTokenizer, tiny_drafter, tiny_generator, tiny_target


@pytest.fixture(scope="module")
def gen():
    return tiny_generator("llama")


@pytest.mark.parametrize("method", ["generate", "generate_target_only"])
@pytest.mark.parametrize("prompt, kwargs, error, match", [
    ([1, 2, 3], dict(stop="20"), TypeError, "stop must be a list of strings"),
    ([1, 2, 3], dict(stop=[20]), TypeError, "stop must be a list of strings"),
    ([], {}, ValueError, "prompt is empty"),
    ([[1, 2], []], {}, ValueError, r"prompt\[1\] is empty"),
    (torch.tensor([], dtype=torch.int64), {}, ValueError, "prompt is empty"),
    (torch.empty(0, 3, dtype=torch.int64), {}, ValueError, "prompt is an empty batch"),
    ([1, 2, 3], dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
    ([1, 2, 3], dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    ([1, 2, 3], dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int"),
    ([{"role": "user"}], {}, ValueError, r"prompt\[0\] must have a string 'content'"),
    ([[{"role": "user", "content": "5 6"}], [{"content": "7"}]], {}, ValueError, r"prompt\[1\]\[0\] must have a string 'role'"),
    ([1, 64, 2], {}, ValueError, r"prompt must hold token ids in \[0, 64\)"),
    ([[1, 2], [-1, 3]], {}, ValueError, r"prompt\[1\] must hold token ids in \[0, 64\)"),
    (torch.tensor([1.0, 2.0]), {}, TypeError, "integer token ids"),
    ([1.5, 2], {}, TypeError, "prompt must be a string"),
    ([1] * 1000, dict(max_new_tokens=100), ValueError, "context window of 1024"),
    ([1, 2, 3], dict(temperature=-1.0), ValueError, "temperature must be finite and >= 0"),
])
def test_bad_requests_raise_naming_the_argument(gen, method, prompt, kwargs, error, match):
    if method == "generate_target_only" and "stop" in kwargs:
        pytest.skip("the baseline takes no stop strings")
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(error, match=match):
        getattr(gen, method)(prompt, **kwargs)


@pytest.mark.parametrize("name,value", [("stop", ["x"]), ("sampling", None), ("generator", None), ("stream", None),
                                        ("use_head", False), ("num_drafts", 4), ("tree", "chain"),
                                        ("lookup_tokens", 0), ("datastore_tokens", 0)])
def test_the_baseline_names_the_arguments_it_does_not_take(gen, name, value):
    """generate's own arguments given to generate_target_only: a TypeError naming them, not
    HF's "model_kwargs are not used" from deep inside its generate."""
    with pytest.raises(TypeError, match=f"generate_target_only takes no {name}="):
        gen.generate_target_only([3, 4, 5], max_new_tokens=2, **{name: value})


@pytest.mark.parametrize("n", [2, 0])
def test_the_baseline_refuses_more_than_one_sequence_a_prompt(gen, n):
    """HF's num_return_sequences=2 gives two rows a prompt: the result held only the first
    (one prompt) or misaligned them with the prompts (a batch)."""
    with pytest.raises(ValueError, match="num_return_sequences must be 1"):
        gen.generate_target_only([3, 4, 5], max_new_tokens=2, temperature=1.0, num_return_sequences=n)
    assert len(gen.generate_target_only([3, 4, 5], max_new_tokens=2, num_return_sequences=1).token_ids) == 2


def test_valid_requests_still_run(gen):
    res = gen.generate([[3, 4, 5], [6, 7]], max_new_tokens=5, stop=["9"])
    assert len(res.token_ids) == 2
    assert len(gen.generate(torch.tensor([3, 4, 5]), max_new_tokens=3).token_ids) == 3


def test_seed_out_of_range_names_seed():
    for bad in (2**64, -2**63 - 1):
        with pytest.raises(ValueError, match="seed must be in"):
            SamplingParams(1.0, seed=bad)
    SamplingParams(1.0, seed=2**64 - 1)  # torch.Generator's whole range is fine


def test_num_drafts_with_an_explicit_tree_is_refused(gen):
    with pytest.raises(ValueError, match="num_drafts is a chain's size"):
        gen.generate([1, 2, 3], max_new_tokens=4, tree=TreeShape(2, 3), num_drafts=2)


def test_a_drafter_built_for_another_target_is_refused_up_front():
    """Shape errors deep in the first forward become a ValueError naming the drafter."""
    target = tiny_target("llama")
    other = tiny_target("llama", vocab=96)
    for drafter, match in ((tiny_drafter(other), "vocab_size 96"),
                           (tiny_drafter(target, num_feature_layers=4), None)):
        if match is None:  # the same target: accepted
            DominoGenerator(target, drafter, IdTokenizer())
            continue
        with pytest.raises(ValueError, match=f"drafter: built for a target with {match}"):
            DominoGenerator(target, drafter, IdTokenizer())
    bad_layers = tiny_drafter(target)
    bad_layers.config.target_layer_ids = [1, 9]
    with pytest.raises(ValueError, match=r"drafter: reads target layers \[1, 9\]"):
        DominoGenerator(target, bad_layers, IdTokenizer())
    with pytest.raises(TypeError, match="drafter must be a domino.DominoDraftModel"):
        DominoGenerator(target, object(), IdTokenizer())


def test_load_keeps_a_loaded_target_where_it_is():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="device: the target model is on cpu, not cuda"):
        domino.load(target, tiny_drafter(target), IdTokenizer(), device="cuda")
    gen = domino.load(target, tiny_drafter(target), IdTokenizer())
    assert next(gen.drafter.parameters()).device == next(target.parameters()).device


def test_the_kv_cache_goes_under_the_keyword_transformers_takes():
    """transformers 5.24 renamed forward's and generate's ``past_key_values`` to ``cache``
    (the old name warns, and goes in 5.40): the engine passes whichever the installed
    version's signature has, and generating warns about neither."""
    import warnings

    from domino.target import cache_kwarg
    from engine_cases import prompts
    from tiny_models import tiny_generator

    def new(input_ids=None, cache=None, **kw):
        pass

    def old(input_ids=None, past_key_values=None, **kw):
        pass

    assert cache_kwarg(new) == "cache" and cache_kwarg(old) == "past_key_values"
    gen = tiny_generator("qwen3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen.generate(prompts(1), max_new_tokens=6, num_drafts=3)
    assert not [w for w in caught if "past_key_values" in str(w.message)]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(use_head="no"), TypeError, "use_head must be a bool"),
    (dict(stream="print"), TypeError, "stream must be a callable"),
    (dict(generator=[torch.Generator()]), TypeError, "generator must be a torch.Generator or None"),
    (dict(tree=TreeShape(65, 2)), ValueError, r"tree: topk \(65\) must be at most the drafter's vocabulary \(64"),
])
def test_engine_only_arguments_are_checked_before_any_work(gen, kwargs, error, match):
    """Checked up front (a bad stream once failed after the prefill, naming no argument;
    use_head="no" ran with the head on; a tree topk past the vocabulary failed in the
    kernels, naming their num_children)."""
    with pytest.raises(error, match=match):
        gen.generate([1, 2, 3], max_new_tokens=4, **kwargs)


def test_temperatures_below_greedy_below_are_greedy_requests(gen):
    """A temperature under domino_ops.sampling.GREEDY_BELOW is the argmax: the request is a
    greedy one everywhere (it had crashed the default tree with a seed or in a batch, and
    alone lost the budget and lookup), and the baseline decodes it too (HF's sampler had
    divided by it)."""
    assert SamplingParams(1e-30).temperature == 0.0 and SamplingParams(0.5).temperature == 0.5
    greedy = gen.generate([[3, 4, 5], [6, 7]], max_new_tokens=6).token_ids
    tiny = gen.generate([[3, 4, 5], [6, 7]], max_new_tokens=6,
                        sampling=[SamplingParams(1e-30, seed=1), SamplingParams(0.0)]).token_ids
    assert tiny == greedy
    assert gen.generate_target_only([3, 4, 5], max_new_tokens=6, temperature=1e-40).token_ids == greedy[0]


def test_load_refuses_a_bad_drafter_or_dtype_by_name():
    target = tiny_target("llama")
    with pytest.raises(TypeError, match="drafter must be a checkpoint path, a DominoDraftModel or None"):
        domino.load(target, 123, IdTokenizer())
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        domino.load(target, tiny_drafter(target), IdTokenizer(), dtype="bfloat16")


# ---- found by a review of the entry points (seventy-second session) -----------------------

def test_load_refuses_a_bad_target_tokenizer_device_or_drafter_directory_by_name(tmp_path):
    """Each had ended in an error from deep inside (an AttributeError on None's
    parameters, a KeyError on 'mask_token_id' for a target's directory given as the
    drafter, HF's hub-id message for a missing directory, torch's for a bad device)."""
    target = tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    (tmp_path / "empty").mkdir()
    for bad in (None, 5):
        with pytest.raises(TypeError, match="target must be a model directory or a loaded HF causal LM"):
            domino.load(bad)
    with pytest.raises(ValueError, match="target: cannot load .*no such directory here"):
        domino.load(tmp_path / "missing", None, IdTokenizer())
    with pytest.raises(ValueError, match="drafter: .* is not a DFlash or Domino drafter's config"):
        domino.load(target, tmp_path / "target", IdTokenizer())
    with pytest.raises(ValueError, match="drafter: no config.json in"):
        domino.load(target, tmp_path / "empty", IdTokenizer())
    with pytest.raises(TypeError, match="tokenizer must be a HF tokenizer, its directory or None"):
        domino.load(target, None, 5)
    with pytest.raises(ValueError, match="device: 'bogus' is not a torch device"):
        domino.load(tmp_path / "target", None, IdTokenizer(), device="bogus")


@pytest.mark.parametrize("method", ["generate", "generate_plain"])
@pytest.mark.parametrize("sampling", [5, "greedy", {"temperature": 0.5}])
def test_sampling_that_is_no_params_or_list_is_refused_by_name(gen, method, sampling):
    with pytest.raises(TypeError, match="sampling must be a SamplingParams or a list of 1"):
        getattr(gen, method)([1, 2, 3], max_new_tokens=4, sampling=sampling)


# ---- found by a review's adversarial requests (sixty-fourth session) ---------------------

def _greedy(gen, prompt, n):
    return gen.generate_target_only(prompt, max_new_tokens=n).token_ids


def test_a_huge_lookup_or_datastore_budget_costs_nothing(gen):
    """lookup_tokens / datastore_tokens past the drafter's num_drafts: a graft adds no node
    deeper, so the chains are cut there (each kind of graft's acceptance table had a slot per
    token: 10**9 of them took the process's memory)."""
    p = [1, 2, 3, 1, 2, 3, 1, 2]
    assert gen.generate(p, max_new_tokens=6, lookup_tokens=10**9).token_ids == _greedy(gen, p, 6)
    assert gen.generate(p, max_new_tokens=6, datastore_tokens=10**9).token_ids == _greedy(gen, p, 6)


@pytest.mark.parametrize("pad", [100, -1])
def test_a_pad_id_the_target_cannot_embed_still_pads_a_batch(pad):
    """A tokenizer given a pad token without the model's embeddings resized: a batch pads
    with an id the target embeds (padding is masked), where it raised IndexError."""
    target = tiny_target("llama")
    tok = IdTokenizer()
    tok.pad_token_id = pad
    g = DominoGenerator(target, tiny_drafter(target), tok)
    ps = [[1, 2, 3], [4]]
    want = [_greedy(g, p, 4) for p in ps]
    assert g.generate(ps, max_new_tokens=4).token_ids == want
    assert g.generate_plain(ps, max_new_tokens=4).token_ids == want
    assert g.generate_target_only(ps, max_new_tokens=4).token_ids == want


def test_a_float16_drafter_is_refused_up_front_and_load_keeps_it_float32(tmp_path):
    """The head's kernels take float32 or bfloat16: a float16 drafter is refused by name
    when the generator is made (it failed inside the first round's head op), and
    load(dtype=torch.float16) gives the float16 target a float32 drafter."""
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="drafter: its weights are float16"):
        DominoGenerator(target, tiny_drafter(target).half(), IdTokenizer())
    tiny_drafter(target).save_pretrained(tmp_path)
    g = domino.load(target, tmp_path, IdTokenizer(), dtype=torch.float16)
    assert next(g.drafter.parameters()).dtype == torch.float32
    assert g.generate([1, 2, 3], max_new_tokens=4).token_ids == _greedy(g, [1, 2, 3], 4)


def test_auto_drafts_chains_when_the_draft_vocabulary_is_below_the_default_trees_topk():
    """tree="auto" with a draft vocabulary of 2 tokens (DEFAULT_TREE has topk 3): chains,
    not an error about a tree the caller never asked for."""
    g = tiny_generator("qwen3")
    g.drafter.set_draft_vocab(torch.tensor([7, 45]))
    assert g.generate([1, 2, 3], max_new_tokens=6).token_ids == _greedy(g, [1, 2, 3], 6)


def test_numpy_integers_are_ints_to_the_engine(gen):
    """NumPy integers pass where Python ints do (num_drafts, lookup_tokens, TreeShape,
    a seed), as max_new_tokens, top_k and token ids already did; a float still does not."""
    import numpy as np

    p = [1, 2, 3, 4]
    want = _greedy(gen, p, 5)
    assert gen.generate(p, max_new_tokens=5, tree=None, num_drafts=np.int64(3)).token_ids == want
    assert gen.generate(p, max_new_tokens=5, lookup_tokens=np.int32(3)).token_ids == want
    shape = TreeShape(np.int64(2), np.int64(2), np.int64(5))
    assert type(shape.topk) is int and shape == TreeShape(2, 2, 5)
    assert gen.generate(p, max_new_tokens=5, tree=shape).token_ids == want
    assert SamplingParams(1.0, seed=np.int64(3)) == SamplingParams(1.0, seed=3)
    with pytest.raises(ValueError, match=r"num_drafts must be None or an int in \[0, "):
        gen.generate(p, max_new_tokens=5, tree=None, num_drafts=3.0)
