"""domino: lossless Domino speculative decoding on HF transformers targets.

    gen = domino.load_default()                     # SmolLM2-135M-Instruct + its drafter
    res = gen.generate("Write a haiku", max_new_tokens=64)
    res.text, res.token_ids, res.acceptance_lengths, res.tokens_per_second
"""

from domino.config import DominoConfig
from domino.generate import DominoGenerator, GenerationResult
from domino.loading import load, load_default
from domino.model import DominoDraftModel
from domino.sampling_params import SamplingParams
from domino.tree import TreeShape

__all__ = ["DominoConfig", "DominoDraftModel", "DominoGenerator", "GenerationResult", "SamplingParams", "TreeShape",
           "load", "load_default"]
