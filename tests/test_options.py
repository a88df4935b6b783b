"""The backend's options object, its validation errors, its uuid, and how torch.compile reaches the backend."""
import importlib.util

import pytest
import torch

from compiler.backend import pulsar_dosa
from compiler.options import CompileOptions
from compiler.report import collecting


def test_defaults():
    opts = CompileOptions.from_user(None)
    assert (opts.downstream, opts.passes, opts.path, opts.record_stats) == ("inductor", None, "auto", True)
    assert opts.indexer_precision == "bf16"
    assert opts.enabled_passes() == ("dsa_indexer", "sparse_attention", "attention", "dsa_mask")
    assert CompileOptions(passes=["attention", "dsa_indexer"]).enabled_passes() == ("dsa_indexer", "attention")


def test_unknown_key_is_a_value_error_naming_the_key():
    with pytest.raises(ValueError, match="unknown key 'downstrem'"):
        CompileOptions.from_user({"downstrem": "eager"})


@pytest.mark.parametrize("key,value,error,text", [
    ("downstream", "tvm", ValueError, "'downstream'.*'inductor', 'eager', 'tensorrt'"),
    ("downstream", 3, TypeError, "'downstream'"),
    ("path", "fast", ValueError, "'path'.*'auto', 'dense', 'certified'"),
    ("indexer_precision", "e4m3", ValueError, "'indexer_precision'.*'bf16', 'fp8', 'fp8_unrotated'"),
    ("indexer_precision", 8, TypeError, "'indexer_precision'"),
    ("record_stats", 1, TypeError, "'record_stats': expected a bool"),
    ("passes", "dsa_indexer", TypeError, "'passes': expected a list"),
    ("passes", ["dsa_indexer", "nope"], ValueError, "unknown pass family 'nope'"),
    ("passes", ["dsa_indexer", "dsa_indexer"], ValueError, "listed twice"),
])
def test_bad_values_name_the_key_and_what_was_expected(key, value, error, text):
    with pytest.raises(error, match=text):
        CompileOptions.from_user({key: value})


def test_options_must_be_a_mapping():
    with pytest.raises(TypeError, match="options: expected a dict"):
        CompileOptions.from_user(["eager"])


@pytest.mark.skipif(importlib.util.find_spec("torch_tensorrt") is not None, reason="torch_tensorrt is installed")
def test_tensorrt_without_torch_tensorrt_is_a_clear_error():
    with pytest.raises(ImportError, match="torch_tensorrt.*not importable"):
        CompileOptions.from_user({"downstream": "tensorrt"})


def test_uuid_is_stable_and_changes_with_any_option():
    a = CompileOptions.from_user({"downstream": "eager"})
    assert a.uuid() == CompileOptions.from_user({"downstream": "eager"}).uuid()
    others = [{"downstream": "inductor"}, {"downstream": "eager", "path": "dense"},
              {"downstream": "eager", "record_stats": False}, {"downstream": "eager", "passes": []},
              {"downstream": "eager", "indexer_precision": "fp8"}]
    assert len({a.uuid(), *(CompileOptions.from_user(o).uuid() for o in others)}) == 6


def test_options_are_frozen():
    with pytest.raises(Exception):
        CompileOptions().downstream = "eager"


def _tiny(x):
    return torch.topk(x.sin(), 2).indices


def test_backend_name_resolves_without_import_and_receives_torch_compile_options():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("pulsar_dosa") is pulsar_dosa
    torch._dynamo.reset()
    with collecting() as report:
        fn = torch.compile(_tiny, backend="pulsar_dosa", options={"downstream": "eager", "path": "dense"})
        assert torch.equal(fn(torch.arange(6.0)), _tiny(torch.arange(6.0)))
    assert report.compiles[0]["downstream"] == "eager"
    assert report.compiles[0]["options_uuid"] == CompileOptions.from_user(
        {"downstream": "eager", "path": "dense"}).uuid()
    assert [name for _, name, _ in report.pass_times][:1] == ["dsa_indexer"]


def test_bad_options_through_torch_compile_fail_with_the_options_error():
    torch._dynamo.reset()
    fn = torch.compile(_tiny, backend="pulsar_dosa", options={"downstream": "tvm"})
    with pytest.raises(Exception, match="'downstream'.*expected one of"):
        fn(torch.arange(6.0))


@pytest.mark.parametrize("key,value,error,text", [
    ("downstream", "tvm", ValueError, "'downstream'.*expected one of"),
    ("path", "fast", ValueError, "'path'"),
    ("record_stats", 1, TypeError, "'record_stats': expected a bool"),
    ("passes", ["nope"], ValueError, "unknown pass family 'nope'"),
    ("plan", 3, TypeError, "'plan': expected a path"),
])
def test_built_directly_the_options_validate_like_from_user(key, value, error, text):
    with pytest.raises(error, match=text):
        CompileOptions(**{key: value})


def test_built_directly_the_options_are_normalised_like_from_user():
    direct = CompileOptions(passes=["attention"], downstream="eager")
    assert direct.passes == ("attention",)
    assert direct == CompileOptions.from_user({"passes": ["attention"], "downstream": "eager"})
    assert direct.uuid() == CompileOptions.from_user({"passes": ("attention",), "downstream": "eager"}).uuid()


def _indexer(q, k, w):
    return torch.matmul(w.unsqueeze(-2), torch.relu(torch.einsum("bshd,btd->bsht", q, k))).squeeze(-2).topk(2).indices


def test_a_changed_option_compiles_again_with_its_own_graph():
    g = torch.Generator().manual_seed(0)
    args = torch.randn(1, 3, 2, 4, generator=g), torch.randn(1, 5, 4, generator=g), torch.randn(1, 3, 2, generator=g)
    paths = ["dense", "certified", "dense"]
    torch._dynamo.reset()
    with collecting() as report:
        for path in paths:
            torch.compile(_indexer, backend="pulsar_dosa", options={"downstream": "eager", "path": path})(*args)
    # the third call reuses what the first compiled: same backend, equal options
    assert [c["options_uuid"] for c in report.compiles] == [
        CompileOptions(downstream="eager", path=p).uuid() for p in paths[:2]]
    assert [r.path for r in report.rewrites] == paths[:2]


def test_capture_without_the_indexer_pass_is_refused_naming_both_options():
    with pytest.raises(ValueError, match=r"option 'capture': .* option 'passes' \['attention'\] leaves that pass out"):
        CompileOptions(capture=True, passes=["attention"])
    assert CompileOptions(capture=True, passes=["dsa_indexer"]).capture
