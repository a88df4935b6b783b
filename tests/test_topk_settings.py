"""The one settings object of a certified top-K layer: its vocabulary, its validation, and the
same spelling in the options, the plans, the op and the runtime configuration."""
import pytest
import torch

from compiler.options import CompileOptions
from compiler.topk_settings import CHOICES, PATHS, TopkSettings, settings_of
from runtime import certified_topk
from runtime.certified_topk import CertifiedTopkConfig


def test_the_path_names_are_defined_once_and_shared():
    assert PATHS is certified_topk.PATHS and CHOICES == ("auto",) + PATHS
    with pytest.raises(ValueError, match="option 'path': expected one of"):
        CompileOptions.from_user({"path": "fast"})
    with pytest.raises(ValueError, match="path: expected one of"):
        torch.ops.pulsar_dosa.certified_topk(torch.ones(1, 1, 2, 4), torch.ones(1, 3, 4), torch.ones(1, 1, 2), 2,
                                             path="fast", record_stats=False)


@pytest.mark.parametrize("fields, error, name", [
    (("fast",), ValueError, "path"), (("auto", 0), ValueError, "r"), (("auto", True), TypeError, "r"),
    (("auto", None, -1), ValueError, "min_keys"), (("auto", None, 2.0), TypeError, "min_keys"),
    (("auto", None, None, 3), ValueError, "list_queries"), (("auto", None, None, 0), ValueError, "list_queries"),
    (("auto", None, None, None, 1), TypeError, "witnesses"),
    (("auto", None, None, None, "no"), TypeError, "witnesses")])
def test_bad_fields_are_named(fields, error, name):
    with pytest.raises(error, match=f"^{name}: expected"):
        TopkSettings(*fields)


def test_op_arguments_and_the_runtime_configuration_use_the_same_names():
    settings = TopkSettings("auto", 3, 50000, 2, False)
    assert settings.op_arguments() == {"path": "auto", "r": 3, "min_keys": 50000, "list_queries": 2, "witnesses": False}
    assert settings.runtime_config("dense") == CertifiedTopkConfig(r=3, path="dense", list_queries=2, witnesses=False)
    assert TopkSettings().runtime_config("certified") == CertifiedTopkConfig()  # None: the runtime's defaults
    assert TopkSettings(witnesses=True).runtime_config("certified").witnesses is True
    assert settings_of("auto", 3, 50000, 2, False) is settings_of("auto", 3, 50000, 2, False) == settings
