"""Tiny transformers models (random weights, built from a config: no download) for
`python -m harness module`, with their own gradient checkpointing behind ``checkpointing``.

    python -m harness module examples.hf_models:gpt2 --impl as-built          # transformers' own checkpointing
    python -m harness module examples.hf_models:gpt2 --impl torch --wrap 'transformer.h.*'
    python -m harness module examples.hf_models:t5 --impl bundled --mode reentrant --wrap '*.block.*'

Every dropout, attention dropout and residual dropout is on (0.1).  With ``checkpointing=True`` a
factory turns transformers' own checkpointing on as a training script does, through
`harness.checkpoint.hf.enable_checkpointing`: ``model.activation_checkpointing_enable(
activation_checkpointing_kwargs={"use_reentrant": ...}, every_n_layers=..., offload=...)`` where this
transformers has it (5.23 on), else ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=
{"use_reentrant": ...})`` (deprecated in 5.23, removed in v6); module mode's report names the one
used and the transformers version.  Non-reentrant (transformers' default) in the plain factories,
reentrant in the ``*_reentrant`` ones; ``gpt2_every_2`` and ``bart_every_3`` checkpoint every second
(third) layer only (``every_n_layers``, counted across the encoder and the decoder), ``gpt2_offload``
and ``gpt2_offload_reentrant`` hold what the checkpoint saves in pinned host memory (``offload``:
torch's ``save_on_cpu``; on a machine with no accelerator torch cannot pin memory, and the model
raises).  Inputs are token ids with ``use_cache=False``, as in training: a KV cache left on is
appended to again by every recompute.
"""

from __future__ import annotations

import torch

from harness.checkpoint.hf import enable_checkpointing, set_checkpoint_function
from harness.module_mode import ModelCase

VOCAB, BATCH, SEQ = 64, 2, 8


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _checkpointed(model: torch.nn.Module, checkpointing: bool, reentrant: bool, every_n_layers: int = 1,
                  offload: bool = False) -> torch.nn.Module:
    if checkpointing:
        enable_checkpointing(model, reentrant=reentrant, every_n_layers=every_n_layers, offload=offload)
    return model


def _decoder_only(model: torch.nn.Module) -> ModelCase:
    return ModelCase(model, {"input_ids": _ids(3), "use_cache": False})


def _encoder_decoder(model: torch.nn.Module) -> ModelCase:
    return ModelCase(model, {"input_ids": _ids(3), "decoder_input_ids": _ids(4), "use_cache": False})


def gpt2(checkpointing: bool = False, attn: str = "eager", reentrant: bool = False, layers: int = 2,
         every_n_layers: int = 1, offload: bool = False) -> ModelCase:
    """GPT-2 (a decoder): 2 blocks, 32 wide, embedding, attention and residual dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.1,
                        embd_pdrop=0.1, attn_pdrop=0.1, attn_implementation=attn, bos_token_id=0, eos_token_id=0)
    return _decoder_only(_checkpointed(GPT2LMHeadModel(config), checkpointing, reentrant, every_n_layers, offload))


def gpt2_sdpa(checkpointing: bool = False) -> ModelCase:
    """GPT-2 with torch's scaled_dot_product_attention (dropout inside the attention op)."""
    return gpt2(checkpointing, attn="sdpa")


def gpt2_reentrant(checkpointing: bool = False) -> ModelCase:
    return gpt2(checkpointing, reentrant=True)


def gpt2_every_2(checkpointing: bool = False) -> ModelCase:
    """GPT-2 with 3 blocks, every second one checkpointed (``every_n_layers=2``: blocks 0 and 2);
    block 1 keeps its activations between them."""
    return gpt2(checkpointing, layers=3, every_n_layers=2)


def gpt2_offload(checkpointing: bool = False) -> ModelCase:
    """GPT-2 checkpointed with ``offload=True``: what the checkpoint saves goes to pinned host memory."""
    return gpt2(checkpointing, offload=True)


def gpt2_offload_reentrant(checkpointing: bool = False) -> ModelCase:
    """The same, reentrant: the saved block inputs are what ``save_on_cpu`` moves."""
    return gpt2(checkpointing, reentrant=True, offload=True)


def llama(checkpointing: bool = False, attn: str = "eager", reentrant: bool = False) -> ModelCase:
    """Llama (a decoder with rotary positions and grouped-query attention): attention dropout."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attention_dropout=0.1, attn_implementation=attn, bos_token_id=0, eos_token_id=0)
    return _decoder_only(_checkpointed(LlamaModel(config), checkpointing, reentrant))


def llama_sdpa(checkpointing: bool = False) -> ModelCase:
    return llama(checkpointing, attn="sdpa")


def bert(checkpointing: bool = False, reentrant: bool = False) -> ModelCase:
    """BERT (an encoder): hidden and attention-probability dropout."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, attn_implementation="eager")
    return ModelCase(_checkpointed(BertModel(config), checkpointing, reentrant), {"input_ids": _ids(3)})


def t5(checkpointing: bool = False, reentrant: bool = False) -> ModelCase:
    """T5 (an encoder-decoder): dropout everywhere, relative attention bias."""
    from transformers import T5Config, T5Model

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.1,
                      attn_implementation="eager", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return _encoder_decoder(_checkpointed(T5Model(config), checkpointing, reentrant))


def t5_reentrant(checkpointing: bool = False) -> ModelCase:
    return t5(checkpointing, reentrant=True)


def bart(checkpointing: bool = False, reentrant: bool = False, layerdrop: float = 0.0,
         every_n_layers: int = 1) -> ModelCase:
    """BART (an encoder-decoder): dropout, attention and activation dropout, optional layer drop."""
    from transformers import BartConfig, BartModel

    config = BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.1,
                        attention_dropout=0.1, activation_dropout=0.1, max_position_embeddings=32,
                        encoder_layerdrop=layerdrop, decoder_layerdrop=layerdrop, attn_implementation="eager",
                        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
    return _encoder_decoder(_checkpointed(BartModel(config), checkpointing, reentrant, every_n_layers))


def bart_layerdrop(checkpointing: bool = False) -> ModelCase:
    """BART with ``layerdrop=0.3``: each layer skips itself at random (a ``torch.rand([])`` draw)."""
    return bart(checkpointing, layerdrop=0.3)


def bart_every_3(checkpointing: bool = False) -> ModelCase:
    """BART with every third layer checkpointed (``every_n_layers=3``), counted across the encoder's two
    layers and then the decoder's: ``encoder.layers.0`` and ``decoder.layers.1``."""
    return bart(checkpointing, every_n_layers=3)


def _save_region(module: torch.nn.Module, name: str) -> None:
    """Run `module`'s forward as a torch_remat SAVE region (``recompute=False``): its activations,
    attention dropout included, are kept, not recomputed; its output is marked as needed by the
    recompute around it (the residual add after it reads it).  The module and its parameters stay
    where they are: only its ``forward`` is wrapped."""
    import torch_remat as remat

    inner = module.forward

    def forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = remat.region(inner, name, recompute=False)(*args, **kwargs)
        remat.recompute_needs_tensor(out[0] if isinstance(out, (tuple, list)) else out)
        return out

    module.forward = forward  # type: ignore[method-assign]


def gpt2_remat(checkpointing: bool = False, hook: str = "harness") -> ModelCase:
    """GPT-2 checkpointed by torch_remat through transformers' own hook for it
    (``_set_gradient_checkpointing(gradient_checkpointing_func=...)``, what
    ``activation_checkpointing_enable`` and ``gradient_checkpointing_enable`` call:
    `harness.checkpoint.hf.set_checkpoint_function`), each block's attention a SAVE region; `hook`:
    ``harness`` (`harness.checkpoint.RecomputeRNGHook`) or ``none`` (torch_remat's default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.1,
                        embd_pdrop=0.1, attn_pdrop=0.1, attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    if checkpointing:
        import torch_remat as remat

        from harness.checkpoint import RecomputeRNGHook

        hooks = (RecomputeRNGHook(),) if hook == "harness" else ()

        def remat_checkpoint(function, *args):  # type: ignore[no-untyped-def]
            return remat.checkpoint(region_name="block", recompute_state_hooks=hooks)(function)(*args)

        for block in model.transformer.h:
            _save_region(block.attn, "attention")
        model.train()
        set_checkpoint_function(model, remat_checkpoint)
    return _decoder_only(model)


def gpt2_remat_no_hook(checkpointing: bool = False) -> ModelCase:
    """The same with torch_remat's default: no RecomputeStateHook."""
    return gpt2_remat(checkpointing, hook="none")
