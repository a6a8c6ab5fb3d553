"""The embedded default (SmolLM2-135M-Instruct + the default drafter) is lossless on real prompts."""

import sys

import pytest
import torch

import domino

PROMPTS = [
    "Write a Python function that returns the factorial of n.",
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def gen():
    return domino.load_default()


def test_api_contract(gen):
    assert gen.tokenizer is not None and gen.target is not None
    res = gen.generate("Say hi.", max_new_tokens=8)
    assert isinstance(res.text, str) and len(res.token_ids) <= 8
    assert sum(res.acceptance_lengths) >= len(res.token_ids) - 1 and res.tokens_per_second > 0
    ids = gen.encode("Say hi.")
    assert gen.generate(ids, max_new_tokens=8).token_ids == res.token_ids


def test_the_default_runs_the_fast_forward_where_its_linears_are_packed(gen, monkeypatch):
    """The main job's target (and so its plain-decoding baseline) runs domino.fast_forward
    wherever its bf16 linears run the packed kernel, and a generation takes the fast path,
    not HF's forward, after HF's forward has run once (its output-capturing hooks stay)."""
    from domino import fast_forward
    from domino.fast_linear import runs_packed

    packed = runs_packed(gen.target.lm_head, torch.bfloat16)
    assert fast_forward.uses_fast_forward(gen.target) == packed
    if not packed:
        pytest.skip("this CPU does not pack bf16 linears")
    with torch.inference_mode():  # HF's own forward once: it installs its hooks
        type(gen.target).forward(gen.target, input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    calls = []
    product = fast_forward._product
    monkeypatch.setattr(fast_forward, "_product", lambda *a: calls.append(1) or product(*a))
    gen.generate("Say hi.", max_new_tokens=8)
    assert calls


def test_the_fast_forward_computes_what_hf_computes(gen):
    """On the real checkpoint the fast forward's logits over a prompt are bit for bit HF's
    forward over the same switched modules, and within bf16 rounding of stock HF's float32
    forward (a fresh copy of the checkpoint, no kernel switched): a norm that ignores its
    weight is off by more than the logits' scale here."""
    from domino import fast_forward

    if not fast_forward.uses_fast_forward(gen.target):
        pytest.skip("this CPU does not pack bf16 linears: the target runs HF's forward")
    ids = torch.tensor([gen.encode(PROMPTS[0])])
    stock = type(gen.target).from_pretrained(gen.target.config._name_or_path, dtype=torch.float32).eval()
    with torch.inference_mode():
        ours = gen.target(input_ids=ids).logits
        switched = type(gen.target).forward(gen.target, input_ids=ids).logits
        want = stock(input_ids=ids).logits
    assert torch.equal(ours, switched)
    ours = ours.float()
    # HF's own bf16 forward is ~1.2 off here (logits up to ~38); a norm without its weight ~46
    assert (ours - want).abs().max() <= 0.1 * want.abs().max()
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.fixture(scope="module")
def plain_batch1(gen):
    """The target's own greedy tokens for each prompt (computed once for both head modes)."""
    return [gen.generate_target_only(p, max_new_tokens=48).token_ids for p in PROMPTS]


@pytest.mark.parametrize("tree", ["auto", None])  # the default (a tree at T = 0) and the chain
@pytest.mark.parametrize("use_head", [True, False])
def test_greedy_identical_to_target_batch1(gen, plain_batch1, use_head, tree):
    for p, plain in zip(PROMPTS, plain_batch1):
        assert gen.generate(p, max_new_tokens=48, use_head=use_head, tree=tree).token_ids == plain, p


def test_greedy_identical_to_target_batched(gen):
    spec = gen.generate(PROMPTS, max_new_tokens=32)
    plain = gen.generate_target_only(PROMPTS, max_new_tokens=32)
    assert spec.token_ids == plain.token_ids
    single = [gen.generate_target_only(p, max_new_tokens=32).token_ids for p in PROMPTS]
    assert spec.token_ids == single  # left padding changes nothing


# A code prompt (HumanEval/1 as benchmarks/eval_acceptance.py asks it) on which a tree
# accepts long paths through nodes whose attention rows see the cache through the tree
# mask's lowest-value holes: a verification row that differs from the one-token step in
# one bit changed this one's tokens within 24 (a lane-wise softmax sum did, 2026-11-24).
CODE_PROMPT = [{"role": "user", "content": (
    "Complete the following Python function.\n```python\nfrom typing import List\n\n\n"
    "def separate_paren_groups(paren_string: str) -> List[str]:\n"
    '    """ Input to this function is a string containing multiple groups of nested parentheses. Your goal is to\n'
    "    separate those group into separate strings and return the list of those.\n"
    "    Separate groups are balanced (each open brace is properly closed) and not nested within each other\n"
    "    Ignore any spaces in the input string.\n"
    "    >>> separate_paren_groups('( ) (( )) (( )( ))')\n"
    "    ['()', '(())', '(()())']\n"
    '    """\n```')}]


@pytest.mark.parametrize("shape", [(3, 4, 8), (2, 6, 12)])
def test_greedy_tree_identical_to_target(gen, plain_batch1, shape):
    """Trees on the real target: every node's verification row must give the bits of the
    one-token step on its path (small_batch_attention and small_batch_linear), or a tree
    accepts a token plain decoding would not have chosen."""
    tree = domino.TreeShape(*shape)
    for p, plain in zip(PROMPTS, plain_batch1):
        assert gen.generate(p, max_new_tokens=48, tree=tree).token_ids == plain, p
    plain = gen.generate_target_only(CODE_PROMPT, max_new_tokens=64).token_ids
    assert gen.generate(CODE_PROMPT, max_new_tokens=64, tree=tree).token_ids == plain


def test_sampling_runs_and_is_reproducible(gen):
    kw = dict(max_new_tokens=16, temperature=0.8, top_k=50, top_p=0.95)
    a = gen.generate(PROMPTS[0], generator=torch.Generator().manual_seed(1), **kw)
    b = gen.generate(PROMPTS[0], generator=torch.Generator().manual_seed(1), **kw)
    assert a.token_ids == b.token_ids


def test_trainer_generator_eval_runs_as_deployed_and_leaves_the_training_models_alone(gen):
    """training.train's generator acceptance is eval_acceptance's measure on the deployed
    configuration (the same drafter and prompts through load_default's models give the same
    tau), and the fp32 models being trained keep their dtype and PyTorch's linears."""
    import argparse
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eval_acceptance import humaneval_prompts, mean_tau

    from domino.fast_linear import uses_small_batch_linear
    from domino.loading import DEFAULT_DRAFTER_DIR
    from domino.model import DominoDraftModel
    from training.train import generator_acceptance

    target = type(gen.target).from_pretrained(gen.target.config._name_or_path, dtype=torch.float32).eval()
    model = DominoDraftModel.from_pretrained(DEFAULT_DRAFTER_DIR).bind_target(target)
    args = argparse.Namespace(target=None, device="cpu", eval_generator_prompts=2, eval_max_new_tokens=16)
    tau = generator_acceptance(model, target, args)
    assert tau == mean_tau(gen, humaneval_prompts(2), use_head=True, temperature=0.0, max_new_tokens=16)
    assert model.fc.weight.dtype == target.lm_head.weight.dtype == torch.float32
    assert not uses_small_batch_linear(model.fc) and not uses_small_batch_linear(target.lm_head)


def test_gguf_parsed_once_shares_within_the_block_and_restores_gguf():
    import gguf

    from domino import loading

    before = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = next(iter(gguf.MODEL_ARCH_NAMES))
    with pytest.raises(RuntimeError, match="inside"):
        with loading._gguf_parsed_once():
            assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
            raise RuntimeError("inside")
    # restored by identity: whatever gguf's own functions do afterwards is gguf's business
    assert gguf.GGUFReader is before[0] and gguf.get_tensor_name_map is before[1]
