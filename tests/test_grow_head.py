"""training.grow_head: a drafter whose head is grown (its rank, its GRU width, both) drafts
what the drafter it came from drafts (chains, trees, their logits: bit for bit on the
engine's kernels, within rounding on PyTorch's products); it is written as a loadable
drafter with its vocabulary and calibration; it trains its new weights; bad arguments are
named."""
import pytest
import torch

from domino.budget import Calibration
from domino.fast_linear import uses_small_batch_linear
from domino.model import DominoDraftModel
from packed_paths import PACKED, needs_packed
from test_draft_layers import context
from test_grow_layers import assert_drafts_alike, drafts
from tiny_models import fused_drafter, tiny_drafter, tiny_target
from training.grow_head import grow_head, main


def head_weights(d):
    return {"w_ih": d.prefix_gru.weight_ih_l0.detach().clone(), "w_hh": d.prefix_gru.weight_hh_l0.detach().clone(),
            "w1": d.embed_proj[0].weight.detach().clone(), "w2": d.embed_proj[2].weight.detach().clone()}


def check_layout(old: dict, new: dict, r0: int, g0: int, H: int):
    """The old weights in their places, zeros where old outputs would read new weights,
    random (the trained weights' spread) elsewhere."""
    r1, g1 = new["w1"].shape[0], new["w_hh"].shape[1]
    assert torch.equal(new["w2"][:, :r0], old["w2"]) and not new["w2"][:, r0:].any()
    assert torch.equal(new["w1"][:r0, :H + g0], old["w1"]) and not new["w1"][:r0, H + g0:].any()
    for gate in range(3):
        rows, new_rows = slice(gate * g0, (gate + 1) * g0), slice(gate * g1, gate * g1 + g0)
        assert torch.equal(new["w_ih"][new_rows], old["w_ih"][rows])
        assert torch.equal(new["w_hh"][new_rows, :g0], old["w_hh"][rows]) and not new["w_hh"][new_rows, g0:].any()
    randoms = [(new["w1"][r0:], old["w1"])] if r1 > r0 else []
    for gate in range(3):
        if g1 > g0:
            new_rows = slice(gate * g1 + g0, (gate + 1) * g1)
            randoms += [(new["w_ih"][new_rows], old["w_ih"]), (new["w_hh"][new_rows], old["w_hh"])]
    for fresh, trained in randoms:
        assert fresh.abs().amax(dim=-1).gt(0).all()
        assert 0.5 < float(fresh.float().std() / trained.float().std()) < 2.0


def check_grown_drafts_alike(d, *, rank, gru, exact: bool):
    c = d.config
    old = head_weights(d)
    drafts(d, *context(d, 1, 5, 2))  # its caches of head rows and packs filled: the grown one must not read them
    grown = grow_head(d, rank=rank, gru=gru)
    assert grown._target[0] is d._target[0] and grown._target[1] is d._target[1]  # the target's, shared
    assert (d.config.emb_dim, d.config.gru_hidden_dim) == (c.emb_dim, c.gru_hidden_dim)
    for name, w in head_weights(d).items():  # the original untouched
        assert torch.equal(w, old[name]), name
    assert (grown.config.emb_dim, grown.config.gru_hidden_dim) == (rank or c.emb_dim, gru or c.gru_hidden_dim)
    assert not grown.training and grown.embed_proj[2].weight.dtype == d.embed_proj[2].weight.dtype
    check_layout(old, head_weights(grown), c.emb_dim, c.gru_hidden_dim, c.hidden_size)
    # on PyTorch's products the correction's and the GRU's sums now run over zero terms too
    assert_drafts_alike(d, grown, exact=exact)
    return grown


SIZES = [(9, None), (24, None), (None, 17), (None, 40), (12, 20)]


@pytest.mark.parametrize("rank, gru", SIZES)
def test_grown_drafter_drafts_what_it_came_from_drafts(rank, gru):
    """float32 Python head (PyTorch's products, nn.GRU): the same chains and trees, the
    logits within rounding."""
    target = tiny_target("llama")
    d = tiny_drafter(target, seed=5).bind_target(target)  # rank 8, GRU width 16
    with torch.no_grad():  # a head whose correction is not small to begin with
        for p in d.parameters():
            p.add_(0.2 * torch.randn_like(p))
    check_grown_drafts_alike(d, rank=rank, gru=gru, exact=False)


@needs_packed
@pytest.mark.parametrize("rank, gru", [(16, None), (9, None), (None, 32), (None, 17), (16, 32)])
@pytest.mark.parametrize("vocab", [None, torch.arange(5, 60)])
def test_grown_fused_drafter_drafts_what_it_came_from_drafts(rank, gru, vocab):
    """bf16 on the engine's kernels (the head rollout and expand ops), with and without a
    draft vocabulary: the same drafts and logits bit for bit (the zero weights add exact
    zeros to each output's sum), and the grown head still runs the small-batch linear."""
    d = fused_drafter(PACKED[0], layers=1, seed=3).set_draft_vocab(vocab)
    grown = check_grown_drafts_alike(d, rank=rank, gru=gru, exact=True)
    assert uses_small_batch_linear(grown.embed_proj)
    assert vocab is None or torch.equal(grown.draft_vocab, vocab)


def test_written_drafter_loads_with_its_vocabulary_and_calibration(tmp_path, capsys):
    d = tiny_drafter(tiny_target("llama"), seed=2).set_draft_vocab(torch.arange(3, 40))
    d.calibration = Calibration(edges=[0.5, 1.0], rates=[0.2, 0.7])
    d.save_pretrained(tmp_path / "d", dtype=torch.float32)
    main([str(tmp_path / "d"), str(tmp_path / "g"), "--rank", "12", "--gru", "20"])
    assert "head rank 8 -> 12, GRU width 16 -> 20" in capsys.readouterr().out
    g = DominoDraftModel.from_pretrained(tmp_path / "g")
    assert (g.config.emb_dim, g.config.gru_hidden_dim) == (12, 20)
    assert torch.equal(g.draft_vocab, torch.arange(3, 40))
    assert g.calibration.edges == [0.5, 1.0] and g.calibration.rates == [0.2, 0.7]
    same = DominoDraftModel.from_pretrained(tmp_path / "d")
    check_layout(head_weights(same), head_weights(g), 8, 16, same.config.hidden_size)
    heads = ("prefix_gru.", "embed_proj.")
    for name, w in same.state_dict().items():  # every other weight exactly
        if not name.startswith(heads):
            assert torch.equal(g.state_dict()[name], w), name


@pytest.mark.parametrize("kw, msg", [
    ({"rank": 8}, "rank must be an int > the drafter's 8"), ({"rank": 4}, "rank must be an int > the drafter's 8"),
    ({"rank": 12.0}, "rank must be"), ({"rank": True}, "rank must be"), ({"rank": "12"}, "rank must be"),
    ({"gru": 16}, "gru must be an int > the drafter's 16"), ({"gru": -1}, "gru must be"),
    ({"rank": 12, "gru": 8}, "gru must be"), ({}, "give rank, gru or both")])
def test_bad_sizes_are_refused_by_name(kw, msg):
    d = tiny_drafter(tiny_target("llama"))  # rank 8, GRU width 16
    with pytest.raises(ValueError, match=msg):
        grow_head(d, **kw)


def test_a_drafter_without_a_head_is_refused():
    d = tiny_drafter(tiny_target("llama"), projector_type=None)
    with pytest.raises(ValueError, match="no Domino head"):
        grow_head(d, rank=16)


def test_cli_refuses_writing_over_its_input_and_a_bad_size(tmp_path):
    d = tiny_drafter(tiny_target("llama"))
    d.save_pretrained(tmp_path / "d", dtype=torch.float32)
    for argv in ([str(tmp_path / "d"), "--rank", "16"], [str(tmp_path / "g"), "--rank", "8"], [str(tmp_path / "g")]):
        with pytest.raises(SystemExit):
            main([str(tmp_path / "d"), *argv])
