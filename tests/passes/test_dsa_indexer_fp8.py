"""The indexer pass under the option ``indexer_precision``: a compiled DeepSeek-V3.2 model whose every
indexer call is rewritten with ``precision="fp8"`` (on the CPU, where the default keeps every call
stock), with the same output whichever path the op takes."""
import torch

import compiler
from scripts.demo import build_model, indexers, tiny_config


def test_compiled_model_scores_every_indexer_call_in_fp8():
    """On the CPU the default keeps every indexer call's stock subgraph (the op would run its
    plain-torch reference); with indexer_precision="fp8" each is rewritten with precision="fp8", and
    the model's output is the same whichever path the op takes."""
    model = build_model(tiny_config(layers=2), torch.bfloat16)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(0))
    base = {"downstream": "eager", "passes": ["dsa_indexer"]}
    assert not compiler.explain(model, ids, options=base, use_cache=False).rewrites
    outputs = {}
    for path in ("certified", "dense"):
        report = compiler.explain(model, ids, options={**base, "indexer_precision": "fp8", "path": path},
                                  use_cache=False)
        assert sorted(r.module for r in report.rewrites) == sorted(indexers(model))
        assert {r.details["precision"] for r in report.rewrites} == {"fp8"}
        outputs[path] = report.output.logits
    assert torch.equal(outputs["certified"], outputs["dense"])
