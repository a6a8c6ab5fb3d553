"""training.grow_layers: a drafter grown by identity-initialised draft layers drafts what the
drafter it came from drafts (chains, trees, their logits: bit for bit on the fused one-call
layers and batch-invariant kernels, the logits within rounding on PyTorch's products); it is
written as a loadable drafter with its vocabulary and calibration; it trains from there; bad
arguments are named."""
from unittest import mock

import pytest
import torch

from domino.budget import Calibration
from domino.model import DominoDraftModel
from packed_paths import PACKED, needs_packed
from test_draft_layers import context
from tiny_models import fused_drafter, tiny_drafter, tiny_target
from training.grow_layers import grow_layers, main


def drafts(d, cache, anchor, anchor_pos):
    """What drafting gives: a greedy chain's tokens and logits, a tree's candidates."""
    with torch.inference_mode():
        chain = d.draft(cache, anchor, anchor_pos, num_drafts=5)
        tree = d.draft_tree(cache, anchor, anchor_pos, topk=2, depth=3)
    return chain.tokens, chain.vocab_logits, tree.candidates


def check_grown_drafts_alike(d, add, *, exact: bool):
    grown = grow_layers(d, add)
    assert grown._target[0] is d._target[0] and grown._target[1] is d._target[1]  # the target's, shared
    assert len(d.layers) == d.config.num_hidden_layers  # the original untouched
    assert len(grown.layers) == grown.config.num_hidden_layers == d.config.num_hidden_layers + add
    for layer in grown.layers[len(d.layers):]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.q_proj.weight.any()  # a copy of the last layer, not zeros
    # PyTorch's products: the old last layer now runs every block row, not the draft rows alone
    assert_drafts_alike(d, grown, exact=exact)
    return grown


def assert_drafts_alike(d, grown, *, exact: bool):
    """The same chains and trees from the same context features (each drafter keeps its own
    keys and values), the chains' logits bit for bit or within 1e-5."""
    ours = context(d, 2, 13, 4)
    theirs = context(grown, 2, 13, 4)
    (tokens, logits, tree), (g_tokens, g_logits, g_tree) = drafts(d, *ours), drafts(grown, *theirs)
    assert torch.equal(tokens, g_tokens) and torch.equal(tree, g_tree)
    if exact:
        assert torch.equal(logits, g_logits)
    else:
        torch.testing.assert_close(logits, g_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("add", [1, 2])
def test_grown_drafter_drafts_what_it_came_from_drafts(add):
    """float32 Python layers (PyTorch's products): the same chains and trees, the chains'
    logits within rounding."""
    target = tiny_target("llama")
    d = tiny_drafter(target, num_hidden_layers=2, seed=5).bind_target(target)
    with torch.no_grad():  # a last layer whose outputs are not zero to begin with
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    check_grown_drafts_alike(d, add, exact=False)


@needs_packed
def test_grown_fused_drafter_drafts_what_it_came_from_drafts():
    """bf16 on the small-batch linear and the one-call draft layers (as the engine runs it):
    the same drafts and logits bit for bit (the kernels are batch invariant), and the grown
    drafter's layers still run as one call."""
    d = fused_drafter(PACKED[0], layers=2, seed=3)
    grown = check_grown_drafts_alike(d, 1, exact=True)
    calls = []
    op = torch.ops.domino_ops.draft_layers.default

    def counting(*args):
        calls.append(args)
        return op(*args)

    with mock.patch.object(torch.ops.domino_ops.draft_layers, "default", counting):
        drafts(grown, *context(grown, 1, 7, 1))
    assert calls and all(len(c[4]) == 3 for c in calls)  # three layers' key stores in each call


def test_written_drafter_loads_with_its_vocabulary_and_calibration(tmp_path, capsys):
    d = tiny_drafter(tiny_target("llama"), num_hidden_layers=1, seed=2).set_draft_vocab(torch.arange(3, 40))
    d.calibration = Calibration(edges=[0.5, 1.0], rates=[0.2, 0.7])
    d.save_pretrained(tmp_path / "d", dtype=torch.float32)
    main([str(tmp_path / "d"), str(tmp_path / "g"), "--add", "2"])
    assert "1 -> 3 draft layers" in capsys.readouterr().out
    g = DominoDraftModel.from_pretrained(tmp_path / "g")
    assert g.config.num_hidden_layers == 3 and len(g.layers) == 3
    assert torch.equal(g.draft_vocab, torch.arange(3, 40))
    assert g.calibration.edges == [0.5, 1.0] and g.calibration.rates == [0.2, 0.7]
    same = DominoDraftModel.from_pretrained(tmp_path / "d")
    for name, w in same.state_dict().items():  # every weight of the original, exactly
        assert torch.equal(g.state_dict()[name], w), name


@pytest.mark.parametrize("add", [0, -1, 1.0, True, "1"])
def test_bad_add_is_refused_by_name(add):
    d = tiny_drafter(tiny_target("llama"))
    with pytest.raises(ValueError, match="add must be an int >= 1"):
        grow_layers(d, add)


def test_cli_refuses_writing_over_its_input(tmp_path):
    d = tiny_drafter(tiny_target("llama"))
    d.save_pretrained(tmp_path / "d", dtype=torch.float32)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "d"), str(tmp_path / "d")])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "d"), str(tmp_path / "g"), "--add", "0"])
