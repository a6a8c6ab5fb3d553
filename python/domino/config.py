"""Drafter configuration and its ``config.json`` layout (the public DFlash/Domino one)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PretrainedConfig


def evenly_spaced_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """DFlash's target layers: round(1 + i * (L - 4) / (n - 1)) for i in 0..n-1. A target
    too shallow for n distinct layers there (L < n + 3: the formula repeats layers, and
    below 4 layers names layer -1, the embeddings) gets min(n, L) distinct layers spread
    over all of its 0..L-1 instead."""
    L = num_target_layers
    if n == 1:
        return [L // 2]
    if L >= n + 3:
        return [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]
    m = min(n, L)
    return [L // 2] if m == 1 else [int(round(i * (L - 1) / (m - 1))) for i in range(m)]


@dataclass
class DominoConfig:
    """Sizes of a Domino drafter. Attention, MLP and norm sizes follow the target's config.

    ``projector_type`` is "domino" for a drafter with a Domino head and None for a plain
    DFlash drafter (backbone only).
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    model_type: str = "llama"
    num_hidden_layers: int = 1
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    projector_type: str | None = "domino"
    emb_dim: int = 64  # r, rank of the correction
    gru_hidden_dim: int = 256  # G
    pure_draft_prefix_len: int = 1
    shift_label: bool = False
    extra: dict = field(default_factory=dict)  # unknown keys, kept for the round trip

    @property
    def has_head(self) -> bool:
        """Whether the drafter has a Domino head (False: a backbone-only DFlash drafter)."""
        return self.projector_type == "domino"

    @property
    def num_drafts(self) -> int:
        """Drafts per round: B - 1 without shift_label (the anchor's output is unused), B with."""
        return self.block_size if self.shift_label else self.block_size - 1

    @classmethod
    def from_target(cls, target_config: PretrainedConfig, *, num_hidden_layers: int = 1, num_feature_layers: int = 5,
                    mask_token_id: int, block_size: int = 16, emb_dim: int = 64, gru_hidden_dim: int = 256,
                    pure_draft_prefix_len: int = 1, shift_label: bool = False,
                    projector_type: str | None = "domino") -> "DominoConfig":
        """Derives a drafter config from a HF target config (Llama/Qwen2/Qwen3/Gemma3 layout)."""
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        L = tc.num_hidden_layers
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        rope = getattr(tc, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
        return cls(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                   num_attention_heads=tc.num_attention_heads,
                   num_key_value_heads=getattr(tc, "num_key_value_heads", tc.num_attention_heads),
                   head_dim=head_dim, vocab_size=tc.vocab_size, num_target_layers=L,
                   target_layer_ids=evenly_spaced_layer_ids(L, min(num_feature_layers, L)),
                   mask_token_id=mask_token_id, model_type=tc.model_type, num_hidden_layers=num_hidden_layers,
                   block_size=block_size, rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope_theta),
                   max_position_embeddings=tc.max_position_embeddings, projector_type=projector_type,
                   emb_dim=emb_dim, gru_hidden_dim=gru_hidden_dim, pure_draft_prefix_len=pure_draft_prefix_len,
                   shift_label=shift_label)

    # ---- config.json ----------------------------------------------------------------

    _DFLASH_KEYS = ("mask_token_id", "target_layer_ids", "projector_type", "emb_dim", "gru_hidden_dim",
                    "pure_draft_prefix_len", "shift_label")

    def to_json_dict(self) -> dict:
        """The public DFlash/Domino ``config.json`` layout (``dflash_config`` nested)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in self._DFLASH_KEYS and k != "extra"}
        d["architectures"] = ["DominoDraftModel" if self.has_head else "DFlashDraftModel"]
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        if self.has_head:
            dflash.update(projector_type=self.projector_type, emb_dim=self.emb_dim,
                          gru_hidden_dim=self.gru_hidden_dim, pure_draft_prefix_len=self.pure_draft_prefix_len,
                          shift_label=self.shift_label)
        else:
            dflash["shift_label"] = self.shift_label
        d["dflash_config"] = dflash
        return {**self.extra, **d}

    @classmethod
    def from_json_dict(cls, d: dict) -> "DominoConfig":
        """Reads a DFlash or Domino ``config.json`` dict (unknown keys kept in ``extra``)."""
        d = dict(d)
        dflash = d.pop("dflash_config", {}) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: d.pop(k) for k in list(d) if k in known}
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if "rope_theta" not in kwargs and "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        if "head_dim" not in kwargs:
            kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        kwargs["mask_token_id"] = dflash["mask_token_id"]
        kwargs["target_layer_ids"] = list(dflash["target_layer_ids"])
        kwargs["projector_type"] = dflash.get("projector_type")
        for k in ("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label"):
            if k in dflash:
                kwargs[k] = dflash[k]
        d.pop("architectures", None)
        kwargs["extra"] = d
        return cls(**kwargs)

    def save(self, directory: str | Path) -> None:
        """Writes ``directory/config.json``."""
        Path(directory, "config.json").write_text(json.dumps(self.to_json_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "DominoConfig":
        """Reads ``directory/config.json``; ValueError where there is none, or it is not a
        DFlash or Domino drafter's (a target's directory given as the drafter, say)."""
        path = Path(directory, "config.json")
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"drafter: no config.json in {directory} (not a DFlash or Domino checkpoint)") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"drafter: cannot read {path}: {e}") from None
        if not isinstance(d, dict) or "mask_token_id" not in (d.get("dflash_config") or {}):
            raise ValueError(f"drafter: {path} is not a DFlash or Domino drafter's config (it has no "
                             "dflash_config with a mask_token_id)")
        return cls.from_json_dict(d)


def default_drafter_config(target_config) -> DominoConfig:
    """The drafter shape used for SmolLM2-135M (and any small target without a checkpoint)."""
    return DominoConfig.from_target(target_config, num_hidden_layers=2, num_feature_layers=5, mask_token_id=16,
                                    block_size=16, emb_dim=64, gru_hidden_dim=256, pure_draft_prefix_len=1)
