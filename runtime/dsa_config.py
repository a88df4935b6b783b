"""What a transformers configuration says about DSA (DeepSeek Sparse Attention) layers.

A DSA attention layer has a lightning indexer that selects each query's keys; transformers
configures it with ``index_n_heads`` (DeepSeek-V3.2, GLM-5 and the models built like them; some
configurations map another name to it). ``indexer_heads`` reads it, for any configuration, without
building a model. ``PULSAR_UNSUPPORTED`` is why Pulsar layouts do not apply to such layers.
"""
from __future__ import annotations

__all__ = ["PULSAR_UNSUPPORTED", "indexer_heads"]

PULSAR_UNSUPPORTED = (
    "DSA sparse attention does not follow Pulsar layouts (the indexer selects keys under the model's "
    "causal mask and keeps its own key cache, which the Pulsar KV drop does not touch): runtime.pulsar "
    "does not run DSA models")
"""Why a DSA model cannot run under a Pulsar layout (said by the driver and by the DSA ops)."""


def indexer_heads(config: object) -> int | None:
    """The head count of the DSA indexer that ``config`` (a transformers configuration; a composite
    one's text decoder) configures, or None when it configures none."""
    text_config = getattr(config, "get_text_config", None)
    text = text_config(decoder=True) if callable(text_config) else config
    heads = getattr(text, "index_n_heads", None)
    return heads if isinstance(heads, int) and not isinstance(heads, bool) else None
