"""Tiny random ``transformers`` decoders as engines serve them, for the real-model tests.

Twelve families (no weights: random init from a config small enough to compile in seconds),
three decoder layers each, wrapped the way an Eagle3 speculative decoder runs them: the hidden
states of an early, a middle and the last layer are captured into a preallocated buffer that
the model never returns, each through another spelling people write — ``buf[..., s:e].copy_(h)``,
``buf[..., s:e] = h`` and a custom op with ``mutates_args`` — and the logits are returned.
``static-cache`` is Llama writing a ``transformers.StaticCache`` (``index_copy_`` into its
key/value buffers) at ``cache_position``.

Needs the ``transformers`` extra; importing this module without it raises ImportError, so
tests import it after ``pytest.importorskip("transformers")``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

VOCAB, HIDDEN, LAYERS, TOKENS, CACHE_LEN = 64, 32, 3, 6, 16
_SMALL = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)

#: family -> (model class, config class, the family's own settings)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": 8}),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", {"num_local_experts": 4,
                                                         "num_experts_per_tok": 2}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {"head_dim": 8, "num_experts": 4,
                                                            "decoder_sparse_step": 1, **_MOE}),
    "qwen2-moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", {"num_experts": 4,
                                                            "shared_expert_intermediate_size": 32,
                                                            **_MOE}),
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", {
        "n_routed_experts": 4, "first_k_dense_replace": 1, "kv_lora_rank": 16,
        "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
        "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "num_key_value_heads": 4,
        **_MOE}),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", {"head_dim": 8}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 8, "sliding_window": 4}),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", {"head_dim": 8, "sliding_window": 4}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {"pad_token_id": 0, "bos_token_id": 1,
                                               "eos_token_id": 2}),
    "phi": ("PhiForCausalLM", "PhiConfig", {"partial_rotary_factor": 0.5}),
}  # fmt: skip


@torch.library.custom_op("msched_tests::eagle_capture", mutates_args=("dest",))
def eagle_capture(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    """An engine's capture kernel: ``dest[..., start:end] = src``, returning nothing."""
    dest[..., start:end].copy_(src)


@eagle_capture.register_fake
def _(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    return None


def causal_lm(family: str) -> nn.Module:
    """A tiny random model of ``family`` in eval mode (seeded: two calls give one model)."""
    model_class, config_class, own = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**_SMALL, **own})
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


class Eagle3(nn.Module):
    """The logits; the hidden states after layers 1, 2 and 3 go into ``buf`` (never returned),
    by ``copy_``, by item assignment and by a ``mutates_args`` custom op."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        out = self.lm(input_ids=ids, output_hidden_states=True, use_cache=False)
        early, middle, last = out.hidden_states[1:4]
        buf[..., 0:HIDDEN].copy_(early)
        buf[..., HIDDEN : 2 * HIDDEN] = middle
        torch.ops.msched_tests.eagle_capture(buf, last, 2 * HIDDEN, 3 * HIDDEN)
        return out.logits


class StaticCacheStep(nn.Module):
    """One step of Llama over a ``StaticCache`` (its buffers written in place)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.cache = transformers.StaticCache(config=lm.config, max_cache_len=CACHE_LEN)

    def cache_tensors(self) -> list[torch.Tensor]:
        """The cache's key and value buffers (a ``StaticCache`` is no ``nn.Module``: they are
        not among ``buffers()``); empty before the first call allocates them."""
        return [t for layer in self.cache.layers for t in (layer.keys, layer.values)
                if isinstance(t, torch.Tensor)]  # fmt: skip

    def forward(self, ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        out = self.lm(input_ids=ids, past_key_values=self.cache, cache_position=position,
                      use_cache=True)  # fmt: skip
        return out.logits


def build(name: str) -> tuple[nn.Module, Callable[[], list[torch.Tensor]]]:
    """The module for ``name`` (a family, or ``"static-cache"``) and a function making its
    inputs (fresh tensors each call: the capture buffer starts at zero)."""
    if name == "static-cache":
        step = StaticCacheStep(causal_lm("llama"))
        ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))
        return step, lambda: [ids.clone(), torch.arange(TOKENS)]
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    return Eagle3(causal_lm(name)), lambda: [ids.clone(), torch.zeros(1, TOKENS, 3 * HIDDEN)]


NAMES = (*FAMILIES, "static-cache")
#: ``MSCHED_REAL_MODELS=gemma,phi`` builds only those models (``.ci/run`` builds all of them
#: on torch 2.13 and on 2.15, the newest tested release, in one run with its default tier).
ONLY = [n for n in os.environ.get("MSCHED_REAL_MODELS", "").split(",") if n]


def chosen(names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` that `ONLY` names (all of them when it is empty)."""
    return tuple(n for n in names if not ONLY or n in ONLY)
