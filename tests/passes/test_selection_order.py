"""compiler/passes/selection_order.py: an indexer op whose selection is only read as a set is
called with sorted=False; one whose values or order are read keeps sorted=True."""
import pytest
import torch

from scripts.demo import build_model, tiny_config
from tests.passes.test_dsa_indexer import rewritten_graph

ALL = {"downstream": "eager", "stock_below": 0}


@pytest.mark.parametrize("passes", [None, ["dsa_indexer"]])
def test_deepseek_v32_selection_is_read_as_a_set(passes):
    """After the sparse-attention rewrite the indices feed its op; without it, the index mask's scatter."""
    model = build_model(tiny_config(layers=1), torch.float32)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    options = ALL if passes is None else {**ALL, "passes": passes}
    with torch.no_grad():
        _, op, out = rewritten_graph(model, ids, options=options, use_cache=False)
        want = model(ids, use_cache=False).logits
    assert op.kwargs["sorted"] is False
    torch.testing.assert_close(out.logits, want, rtol=1e-4, atol=1e-4)


class Reader(torch.nn.Module):
    """torch.topk of indexer scores, its selection read as ``how`` says."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, q, k, w):
        scores = (torch.relu(torch.einsum("bshd,btd->bsht", q, k)) * w[..., None]).sum(2)
        values, indices = scores.topk(4, dim=-1)
        if self.how == "values":
            return values.sum() + indices.sum()
        if self.how == "first":  # the best key of each row: order matters
            return indices[..., 0]
        src = torch.arange(4.0).expand_as(indices)  # a scatter of a varying source: order matters
        return torch.zeros(scores.shape).scatter(-1, indices, src)


@pytest.mark.parametrize("how", ["values", "first", "scatter_src"])
def test_ordered_reads_keep_the_sort(how):
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(1, 16, 2, 8, generator=g), torch.randn(1, 20, 8, generator=g), torch.rand(1, 16, 2, generator=g)
    _, op, out = rewritten_graph(Reader(how), q, k, w, options=ALL)
    assert op.kwargs.get("sorted", True) is True
    assert torch.equal(out, Reader(how)(q, k, w))
