"""The indexer pass on transformers' GlmMoeDsaForCausalLM (GLM-5 DSA indexer, tiny random init):
one rewrite per layer and logits bitwise equal to eager (downstream "eager", no exact tie at the
kk-th score in this configuration; only the indexer family runs; see tests/passes/test_dsa_indexer_deepseek_v32.py)."""
import torch

import compiler


def test_glm_dsa_indexers_are_rewritten_and_logits_equal_eager():
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    torch.manual_seed(0)
    config = GlmMoeDsaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, kv_lora_rank=16,
        q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1,
        num_experts_per_tok=2, index_topk=8, index_head_dim=64, index_n_heads=8, first_k_dense_replace=1,
        max_position_embeddings=1024)
    model = GlmMoeDsaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    report = compiler.explain(model, ids, options={"downstream": "eager", "stock_below": 0, "passes": ["dsa_indexer"]}, use_cache=False)
    assert sorted(r.module for r in report.rewrites if r.kind == "dsa_indexer") == [
        "model.layers.0.self_attn.indexer", "model.layers.1.self_attn.indexer"]
    assert torch.equal(report.output.logits, want)
