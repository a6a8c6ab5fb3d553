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


@pytest.mark.parametrize("name,value", [("stop", ["x"]), ("sampling", None), ("generator", None), ("stream", None)])
def test_the_baseline_names_the_arguments_it_does_not_take(gen, name, value):
    """generate's own arguments given to generate_target_only: a TypeError naming them, not
    HF's "model_kwargs are not used" from deep inside its generate."""
    with pytest.raises(TypeError, match=f"generate_target_only takes no {name}="):
        gen.generate_target_only([3, 4, 5], max_new_tokens=2, **{name: value})


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
