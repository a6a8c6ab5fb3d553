"""Drafter checkpoints: public key layout, config.json fields, round trip, DFlash loading."""

import json

import pytest
import torch
from safetensors.torch import load_file

from domino import DominoConfig, DominoDraftModel
from tiny_models import tiny_drafter, tiny_target

BACKBONE_KEYS = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.0.{k}.weight" for k in [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm"]}
HEAD_KEYS = {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"}


def test_domino_checkpoint_layout_and_round_trip(tmp_path):
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target)
    drafter.save_pretrained(tmp_path, dtype=torch.float32)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert set(state) == BACKBONE_KEYS | HEAD_KEYS
    c = drafter.config
    H, G, r, V = c.hidden_size, c.gru_hidden_dim, c.emb_dim, c.vocab_size
    assert state["fc.weight"].shape == (H, len(c.target_layer_ids) * H)
    assert state["prefix_gru.weight_ih_l0"].shape == (3 * G, H)
    assert state["prefix_gru.weight_hh_l0"].shape == (3 * G, G)
    assert state["embed_proj.0.weight"].shape == (r, H + G)
    assert state["embed_proj.2.weight"].shape == (V, r)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DominoDraftModel"]
    assert cfg["model_type"] == "qwen3" and cfg["block_size"] == 8 and cfg["num_target_layers"] == 4
    # the weights are as readable as the config (safetensors alone writes them 0600)
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == (tmp_path / "config.json").stat().st_mode & 0o777
    assert cfg["dflash_config"] == {"mask_token_id": 63, "target_layer_ids": c.target_layer_ids,
                                    "projector_type": "domino", "emb_dim": 8, "gru_hidden_dim": 16,
                                    "pure_draft_prefix_len": 1, "shift_label": False}
    loaded = DominoDraftModel.from_pretrained(tmp_path)
    for k, v in drafter.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert loaded.config == drafter.config


def test_dflash_checkpoint_loads_backbone_only(tmp_path):
    target = tiny_target("llama")
    dflash = tiny_drafter(target, projector_type=None)
    dflash.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert set(state) == BACKBONE_KEYS
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert set(cfg["dflash_config"]) == {"mask_token_id", "target_layer_ids", "shift_label"}
    loaded = DominoDraftModel.from_pretrained(tmp_path)
    assert not loaded.config.has_head and not hasattr(loaded, "embed_proj")


def test_public_dflash_config_json_is_understood():
    """The fields of a published DFlash config (z-lab/Qwen3-8B-DFlash-b16 layout)."""
    public = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
              "num_target_layers": 36, "num_hidden_layers": 5, "hidden_size": 4096, "intermediate_size": 12288,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000, "max_position_embeddings": 40960, "vocab_size": 151936,
              "attention_bias": False, "torch_dtype": "bfloat16",
              "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}
    c = DominoConfig.from_json_dict(public)
    assert not c.has_head and c.num_drafts == 15 and c.target_layer_ids == [1, 9, 17, 25, 33]
    again = c.to_json_dict()
    assert again["attention_bias"] is False and again["torch_dtype"] == "bfloat16"  # unknown keys kept
    assert again["dflash_config"]["mask_token_id"] == 151669


def test_mismatched_checkpoint_is_refused(tmp_path):
    target = tiny_target("qwen3")
    tiny_drafter(target).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match its config"):
        DominoDraftModel.from_pretrained(tmp_path)


def test_target_layer_ids_follow_dflash_rule():
    from domino.config import evenly_spaced_layer_ids
    assert evenly_spaced_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert evenly_spaced_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2's, as the shipped drafter reads


@pytest.mark.parametrize("L", range(1, 13))
def test_a_shallow_target_gets_distinct_layers_that_exist(L):
    """Below n + 3 layers DFlash's rule repeats layers (4 layers: [1, 1, 1, 1]) and below 4
    names layer -1 (the embeddings): such a target gets min(n, L) distinct layers of its own."""
    from domino.config import evenly_spaced_layer_ids
    for n in range(1, 7):
        ids = evenly_spaced_layer_ids(L, min(n, L))
        assert all(0 <= i < L for i in ids) and ids == sorted(set(ids)), (L, n, ids)
        assert len(ids) == min(n, L)


def pickled_as_before(model, classes, old_state):
    """``model`` through pickle with each instance of ``classes`` written as the state
    ``old_state(obj)`` (a dict), as an older class held it: what torch.load gives for a
    model saved before that class changed."""
    import io
    import pickle

    class OldPickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, classes):
                return (type(obj).__new__, (type(obj),), old_state(obj))
            return NotImplemented

    buf = io.BytesIO()
    OldPickler(buf).dump(model)
    buf.seek(0)
    return pickle.load(buf)


def test_a_bf16_drafter_keeps_float32_rotary_frequencies(tmp_path):
    """Loaded in bf16 (as deployed), the drafter's rotary tables are the float32 drafter's
    (as trained): the frequencies are not rounded with the weights (they were, as a float
    buffer); a drafter pickled with the old float buffer loads with float32 ones."""
    from domino.model import RotaryEmbedding

    drafter = tiny_drafter(tiny_target("qwen3"))
    drafter.save_pretrained(tmp_path)
    deployed = DominoDraftModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    positions = torch.arange(0, 4000, 7)[None]
    assert deployed.rotary.inv_freq.dtype == torch.float32
    for a, b in zip(deployed.rotary(positions, torch.float32), drafter.rotary(positions, torch.float32)):
        assert torch.equal(a, b)

    def float_buffer(obj):  # the rotary's state as the old class held it
        return {**obj.__dict__, "_buffers": {"inv_freq": obj.inv_freq.clone()},
                "_non_persistent_buffers_set": {"inv_freq"}}

    old = pickled_as_before(drafter, RotaryEmbedding, float_buffer)
    assert torch.equal(old.rotary.inv_freq, drafter.rotary.inv_freq)
    assert "inv_freq_bits" not in old.state_dict()  # still not persistent
    for a, b in zip(old.to(torch.bfloat16).rotary(positions, torch.float32), drafter.rotary(positions, torch.float32)):
        assert torch.equal(a, b)


def test_a_drafter_pickled_before_the_hf_attribute_names_still_loads_and_runs(tmp_path):
    """torch.save(drafter) from before its norms stored HF's `variance_epsilon` and its MLPs
    an `act_fn`: torch.load gives a drafter whose forward is the same."""

    from domino.model import DraftMLP, RMSNorm

    target = tiny_target("qwen3")
    drafter = tiny_drafter(target)
    x = torch.randn(1, 3, drafter.config.hidden_size)
    want = [drafter.layers[0].mlp(x), drafter.norm(x)]

    def before_hf_names(obj):  # the norms' and MLPs' state as the old classes held it
        state = dict(obj.__dict__)
        state["_modules"] = dict(state["_modules"])
        if isinstance(obj, RMSNorm):
            state["eps"] = state.pop("variance_epsilon")
        else:
            del state["_modules"]["act_fn"]
        return state

    old = pickled_as_before(drafter, (RMSNorm, DraftMLP), before_hf_names)
    assert not hasattr(drafter.norm, "eps")  # the current class is not what was pickled
    torch.testing.assert_close(old.layers[0].mlp(x), want[0], rtol=0, atol=0)
    torch.testing.assert_close(old.norm(x), want[1], rtol=0, atol=0)
