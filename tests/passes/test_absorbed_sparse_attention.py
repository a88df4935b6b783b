"""The sparse_attention pass in MLA's absorbed form: the spellings of kv_b_proj's expansion are
recognised, and where k and v are not one, the union op runs and a near miss says why the
absorbed form was not taken; the form decision. (Both DSA models, sdpa and eager, padded batches,
a cache, decode, in either form: tests/passes/test_dsa_sparse_attention.py.)"""
import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.report import collecting

ATOL = 1e-4
ABSORBED = {"downstream": "eager", "stock_below": 0, "sparse_form": "absorbed"}


def _sparse(report):
    return [r for r in report.rewrites if r.kind == "sparse_attention"]


class InlineMLA(torch.nn.Module):
    """The spellings of transformers releases around expand_kv: key = cat((k_nope, k_rot.expand), -1)
    (``buffer``: a new_empty key filled by two copies), value a slice; optionally a bias on kv_b_proj
    and (``leak``) a second reader of the key."""

    def __init__(self, bias=False, buffer=False, leak=False):
        super().__init__()
        torch.manual_seed(0)
        self.kv_b_proj = torch.nn.Linear(16, 4 * (6 + 5), bias=bias)
        self.buffer, self.leak = buffer, leak

    def forward(self, q, latent, k_rot, indices, mask):
        b, _, t, _ = latent.shape
        kv = self.kv_b_proj(latent).view(b, t, -1, 11).transpose(1, 2)
        k_nope, value = kv[..., :6], kv[..., 6:]
        if self.buffer:
            key = kv.new_empty(b, 4, t, 10)
            key[..., :6].copy_(k_nope)
            key[..., 6:].copy_(k_rot)
        else:
            key = torch.cat((k_nope, k_rot.expand(-1, 4, -1, -1)), dim=-1)
        index_mask = indices.new_ones((b, q.shape[2], t), dtype=torch.bool).scatter(-1, indices.long(), False)
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask & ~index_mask.unsqueeze(1), scale=0.3)
        return out, key.sum() if self.leak else out


def _inline_inputs(s=20, t=24):
    g = torch.Generator().manual_seed(5)
    q, latent, k_rot = torch.randn(1, 4, s, 10, generator=g), torch.randn(1, 1, t, 16, generator=g), \
        torch.randn(1, 1, t, 4, generator=g)
    indices = torch.randint(0, t, (1, s, 6), generator=g)
    mask = (torch.arange(t)[None, :] <= torch.arange(t - s, t)[:, None]).view(1, 1, s, t)
    return q, latent, k_rot, indices, mask


@pytest.mark.parametrize("module,miss", [
    (InlineMLA(), None),
    (InlineMLA(buffer=True), None),
    (InlineMLA(bias=True), "absorbed form not taken: kv_b_proj has a bias"),
    (InlineMLA(buffer=True, leak=True), "absorbed form not taken: the key buffer is read or written by sum"),
])
def test_the_inline_spelling_and_why_the_absorbed_form_was_not_taken(module, miss):
    args = _inline_inputs()
    torch._dynamo.reset()
    with collecting() as report, torch.no_grad():
        got = torch.compile(module, backend="pulsar_dosa", options=ABSORBED)(*args)
        want = module(*args)
    (rewrite,) = _sparse(report)
    misses = [m.reason for m in report.near_misses]
    assert rewrite.path == ("absorbed" if miss is None else "union")
    assert [m[:len(miss)] for m in misses] == ([] if miss is None else [miss])
    assert rewrite.details["distinct_indices"] is False  # indices are an input: repeats are possible
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def test_the_form_is_left_to_each_call_decided_on_the_shapes_or_forced():
    from compiler.defaults import UNION_MIN_QUERIES
    from compiler.lowering.defaults import ABSORBED_BLOCK_HEADS
    from compiler.policy import sparse_attention_form

    for heads, queries in ((128, 65536), (ABSORBED_BLOCK_HEADS - 1, object())):  # object(): a symbolic length
        assert sparse_attention_form("auto", heads, queries)[0] == "auto"
    # Under CUDA graphs a call may not measure its selections: the head count decides.
    assert sparse_attention_form("auto", ABSORBED_BLOCK_HEADS, 65536, cuda_graphs=True)[0] == "absorbed"
    assert sparse_attention_form("auto", ABSORBED_BLOCK_HEADS - 1, object(), cuda_graphs=True)[0] == "union"
    for graphs in (False, True):
        assert sparse_attention_form("auto", 4, UNION_MIN_QUERIES - 1, graphs)[0] == "absorbed"
    assert sparse_attention_form("union", 128, 1) == ("union", "option sparse_form")
    with pytest.raises(ValueError, match="expected one of"):
        sparse_attention_form("latent", 128, 1)
    with pytest.raises(ValueError, match="option 'sparse_form'"):
        compiler.CompileOptions(sparse_form="fast")
