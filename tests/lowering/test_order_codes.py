"""The Triton side of the order codes (compiler/lowering/order_codes.py) against their reference,
runtime.order_codes, under TRITON_INTERPRET=1 (integer work only: bitwise on any CPU)."""
import torch
import triton
import triton.language as tl

from compiler.lowering.order_codes import (INT64_MIN, code_of_word, codes_of_words, decode_code, decode_codes,
                                           order_code, word_of_code)
from runtime.order_codes import PADDING, decode_order_codes, encode_order_codes


@triton.jit
def _codes_kernel(score_ptr, visible_ptr, codes_ptr, words_ptr, rebuilt_ptr, values_ptr, keys_ptr, T,
                  BLOCK: tl.constexpr):
    key = tl.arange(0, BLOCK)
    ok = key < T
    code = order_code(tl.load(score_ptr + key, mask=ok, other=0.0), tl.load(visible_ptr + key, mask=ok, other=0) != 0,
                      key, T)
    tl.store(codes_ptr + key, code, mask=ok)
    word = word_of_code(code)
    tl.store(words_ptr + key, word, mask=ok)
    tl.store(rebuilt_ptr + key, tl.where(ok, code_of_word(word, key, T), INT64_MIN), mask=key < BLOCK)
    value, back = decode_code(code, T)
    tl.store(values_ptr + key, value, mask=ok)
    tl.store(keys_ptr + key, back, mask=ok)


def scores_with_every_kind_of_value():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, generator=g)
    scores[:8] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1e-45, -1e-45])
    scores[20:24] = scores[10]  # ties: the lower key first
    visible = torch.rand(40, generator=g) < 0.8
    return scores, visible


def test_the_kernels_codes_are_the_references_and_come_back():
    scores, visible = scores_with_every_kind_of_value()
    T, block = scores.numel(), 64
    codes, rebuilt = torch.empty(T, dtype=torch.int64), torch.empty(block, dtype=torch.int64)
    words, values, keys = torch.empty(T, dtype=torch.int32), torch.empty(T), torch.empty(T, dtype=torch.int64)
    _codes_kernel[(1,)](scores, visible.to(torch.int8), codes, words, rebuilt, values, keys, T, BLOCK=block)
    key = torch.arange(T)
    assert torch.equal(codes, encode_order_codes(scores, visible, key, T))
    assert torch.equal(words, (codes >> 32).to(torch.int32))
    assert torch.equal(rebuilt[:T], codes) and torch.equal(codes_of_words(words), codes)
    assert (rebuilt[T:] == PADDING).all()
    want_values, want_keys = decode_order_codes(codes, T)
    assert torch.equal(keys, want_keys) and torch.equal(keys, key)
    assert torch.equal(values.view(torch.int32), want_values.view(torch.int32))
    host_values, host_keys = decode_codes(codes.view(5, 8), T)
    assert torch.equal(host_values.view(-1).view(torch.int32), values.view(torch.int32))
    assert torch.equal(host_keys.view(-1), keys)


def test_padding_is_below_every_code():
    scores, visible = scores_with_every_kind_of_value()
    lowest = encode_order_codes(torch.zeros(1), torch.zeros(1, dtype=torch.bool), torch.tensor([5]), 6)
    assert INT64_MIN.value == PADDING == torch.iinfo(torch.int64).min
    assert lowest.item() == PADDING  # the hidden key T - 1: PADDING's key
    assert (encode_order_codes(scores, visible, torch.arange(40), 41) > PADDING).all()


def test_the_encodings_numbers_stand_in_this_home_alone():
    """The int64 and int32 minima, the word's shift and the float bits' flip are written in
    compiler/lowering/order_codes.py only; every other kernel names them."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    home = root / "compiler" / "lowering" / "order_codes.py"
    literals = ("9223372036854775808", "2147483648", "4294967296", "0x7FFFFFFF", "0x7fffffff")
    found = [f"{path.relative_to(root)}: {literal}" for path in sorted((root / "compiler").rglob("*.py"))
             if path != home for literal in literals if literal in path.read_text()]
    assert not found, found
