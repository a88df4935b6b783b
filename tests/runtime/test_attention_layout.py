"""Which attention computation a Pulsar layout runs: stock SDPA where the layout is ordinary
attention, else the two-interval kernel registered for the device (the package's entry point
registers the Triton kernel for CUDA); an uncompiled model reaches it."""
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention.bias import CausalBias
from transformers import LlamaConfig, LlamaForCausalLM

import runtime.attention_layout as attention_layout
from runtime.attention_layout import (KERNEL_ENTRY_POINTS, PackedPhase, QueryPhase, attention_kernel,
                                      register_attention_kernel)
from runtime.attention_reference import two_interval_attention
from runtime.pulsar import PulsarConfig, encode_context, generate

SETTINGS = dict(sink=4, chunk=4, ratio=0.25)


def qkv(sq, sk, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, sq, 8, generator=g), torch.randn(1, 2, sk, 8, generator=g), \
        torch.randn(1, 2, sk, 8, generator=g)


@pytest.fixture
def counted_cpu_kernel():
    """A kernel registered for CPU tensors that counts its calls (it computes with the reference)."""
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[0].shape)
        return two_interval_attention(*args, **kwargs)

    register_attention_kernel("cpu", kernel)
    try:
        yield calls
    finally:
        attention_layout._KERNELS.pop("cpu")


def test_only_a_single_causal_sequence_is_a_causal_packed_phase():
    ids = torch.arange(100) % 50
    assert PackedPhase(*_bounds(PulsarConfig(32, mode="dense").layout(ids))).causal
    assert PackedPhase(*_bounds(PulsarConfig(100, **SETTINGS).layout(ids))).causal  # one block
    assert not PackedPhase(*_bounds(PulsarConfig(32, mode="star").layout(ids))).causal
    assert not PackedPhase(*_bounds(PulsarConfig(32, **SETTINGS).layout(ids))).causal


def _bounds(layout):
    return layout.prefix_end, layout.segment_start


def test_stock_attention_gives_the_two_interval_answer_where_it_is_chosen():
    q, k, v = qkv(7, 7)
    causal = PackedPhase(torch.zeros(7, dtype=torch.int64), torch.zeros(7, dtype=torch.int64))
    torch.testing.assert_close(causal.attend(q, k, v, scale=0.3),
                               causal.attend(q, k, v, scale=0.3, attention_fn=two_interval_attention),
                               atol=1e-6, rtol=1e-6)
    # decode; phase 2; new tokens after earlier ones; nothing kept
    for sq, sk, kept in ((1, 9, 8), (3, 9, 6), (3, 12, 6), (5, 5, 0)):
        q, k, v = qkv(sq, sk)
        query = QueryPhase(kept=kept)
        torch.testing.assert_close(query.attend(q, k, v, scale=0.3),
                                   query.attend(q, k, v, scale=0.3, attention_fn=two_interval_attention),
                                   atol=1e-6, rtol=1e-6)


def test_a_query_phase_on_one_device_runs_stock_sdpa_with_causal_attention_aligned_to_the_last_key(
        counted_cpu_kernel, monkeypatch):
    """Several new tokens after the kept keys: one SDPA call with the lower-right causal bias, no
    kernel; each new token sees every kept key and the new tokens up to itself."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted_sdpa(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention_layout, "F", SimpleNamespace(scaled_dot_product_attention=counted_sdpa))
    q, k, v = qkv(4, 10, seed=3)
    out = QueryPhase(kept=6).attend(q, k, v, scale=0.3)
    assert not counted_cpu_kernel and len(calls) == 1 and isinstance(calls[0], CausalBias)
    torch.testing.assert_close(out, two_interval_attention(q, k, v, torch.full((1, 4), 6), torch.full((1, 4), 6),
                                                           scale=0.3, q_start=6)[0], atol=1e-6, rtol=1e-6)
    visible = torch.ones(4, 10, dtype=torch.bool).tril(6)
    manual = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                              attn_mask=visible, scale=0.3)
    torch.testing.assert_close(out, manual, atol=1e-6, rtol=1e-6)


def test_layouts_other_than_ordinary_attention_run_the_registered_kernel(counted_cpu_kernel):
    q, k, v = qkv(7, 7)
    packed = PackedPhase(torch.tensor([0, 0, 0, 3, 3, 3, 3]), torch.tensor([0, 0, 0, 3, 3, 5, 5]))
    packed.attend(q, k, v, scale=0.3)
    QueryPhase(kept=6, merge=lambda o, lse: (o, lse)).attend(*qkv(3, 9), scale=0.3)  # partials to merge
    QueryPhase(kept=8, owner=False).attend(*qkv(1, 9), scale=0.3)          # kept keys only
    assert len(counted_cpu_kernel) == 3
    PackedPhase(torch.zeros(7, dtype=torch.int64), torch.zeros(7, dtype=torch.int64)).attend(q, k, v, scale=0.3)
    QueryPhase(kept=6).attend(*qkv(3, 9), scale=0.3)                       # phase 2 on one device
    QueryPhase(kept=8).attend(*qkv(1, 9), scale=0.3)                       # decode on one device
    assert len(counted_cpu_kernel) == 3  # ordinary attention: stock SDPA


def test_an_uncompiled_model_reaches_the_registered_kernel(counted_cpu_kernel):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    ids, query = torch.randint(0, 256, (100,), generator=g), torch.randint(0, 256, (5,), generator=g)
    pulsar = PulsarConfig(32, **SETTINGS)
    encode_context(model, ids, pulsar.layout(ids))
    assert len(counted_cpu_kernel) == 2  # phase 1, both layers
    generate(model, ids, query, pulsar, max_new_tokens=3, stop_ids=())
    assert len(counted_cpu_kernel) == 2 + 2  # phase 1 again; phase 2 (5 query tokens) and decode are stock
    assert model.config._attn_implementation == "sdpa"


def test_the_package_entry_point_registers_the_triton_kernel_for_cuda():
    text = Path(__file__).resolve().parents[2].joinpath("pyproject.toml").read_text()
    section = re.search(r'^\[project\.entry-points\."' + re.escape(KERNEL_ENTRY_POINTS) + r'"\]\n((?:\w+ = ".*"\n)+)',
                        text, re.M)
    assert section is not None, f"pyproject.toml declares no {KERNEL_ENTRY_POINTS} entry points"
    modules = re.findall(r'= "([\w.]+)"', section.group(1))
    assert modules == ["compiler.lowering.attention.two_interval_attention"]
    from compiler.lowering.attention.two_interval_attention import two_interval_attention_triton

    assert attention_kernel(torch.device("cuda")) is two_interval_attention_triton


def test_a_device_without_a_kernel_gets_the_reference_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="runtime.attention_layout"):
        assert attention_kernel(torch.device("meta")) is two_interval_attention
    assert "no two-interval attention kernel is registered for 'meta'" in caplog.text
    with pytest.raises(TypeError, match="device_type"):
        register_attention_kernel("", two_interval_attention)


@pytest.mark.parametrize("layout", [None, "causal", "two_interval"])
def test_the_attention_op_returns_the_contiguous_layout_of_its_fake_kernel(layout):
    """Inductor checks real strides against the fake kernel's; SDPA on transposed q (as transformers
    passes it) returns a transposed layout, which the op must not hand on."""
    import compiler  # noqa: F401  (registers torch.ops.pulsar_dosa.attention)
    from runtime.attention_layout import use_layout

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 7, heads, 8, generator=g).transpose(1, 2) for heads in (4, 2, 2))
    phases = {"causal": PackedPhase(torch.zeros(7, dtype=torch.int64), torch.zeros(7, dtype=torch.int64)),
              "two_interval": PackedPhase(torch.tensor([0, 0, 0, 3, 3, 3, 3]), torch.tensor([0, 0, 0, 3, 3, 5, 5]))}
    op = torch.ops.pulsar_dosa.attention
    if layout is None:
        out = op(q, k, v, None, True, None, True, "sdpa")
    else:
        with use_layout(phases[layout]):
            out = op(q, k, v, None, True, None, True, "sdpa")
    fake = torch.empty(1, 4, 7, 8)
    assert out.shape == fake.shape and out.stride() == fake.stride()


def test_the_pulsar_driver_imports_neither_transformers_nor_compiler_until_it_runs_a_model():
    """transformers is imported when a model runs (it is a test extra, not a dependency); runtime
    never imports compiler."""
    import subprocess
    import sys

    code = ("import sys, runtime.pulsar, runtime.distributed; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'compiler'}))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
