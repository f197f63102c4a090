"""What vLLM reads of a model without its weights: its config.json, with the public values of each model's own file
(Qwen2.5's architecture fields), written by the tests instead of a download."""

from __future__ import annotations

from typing import Any

# The models' config.json, the public values of each model's own file (what vLLM reads of a model without its
# weights): Qwen2.5's architecture fields. virtuoussy/Qwen2.5-7B-Instruct-RLVR is a Qwen2.5-7B-Instruct fine-tune
# (its own config.json: UNCONFIRMED; the stack's worker sets max_model_len 8000 below either model's limit).
_QWEN25_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
    "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "sliding_window": 32768,
    "use_sliding_window": False, "max_window_layers": 21, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
}
_QWEN25_7B = {
    **_QWEN25_05B, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_window_layers": 28,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "sliding_window": 131072,
    "eos_token_id": 151643,
}
_QWEN25_7B_INSTRUCT = {**_QWEN25_7B, "max_position_embeddings": 32768, "sliding_window": 131072,
                       "eos_token_id": 151645}
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": _QWEN25_05B,
    "Qwen/Qwen2.5-7B": _QWEN25_7B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN25_7B_INSTRUCT,
    "virtuoussy/Qwen2.5-7B-Instruct-RLVR": _QWEN25_7B_INSTRUCT,
}
