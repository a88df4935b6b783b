"""Launch-config choice: one config under the interpreter, fastest by measurement, disk cache."""
import time

import pytest
import torch

from compiler.autotune import (MIN_TUNED_WORK, AutotuneCache, LaunchConfig, choose_config, fastest_config,
                               interpreter_active, length_bucket, tuning_key)

SMALL = LaunchConfig.of(BLOCK_T=16, num_warps=2)
LARGE = LaunchConfig.of(BLOCK_T=4096, num_warps=8, num_stages=3)


def wall_clock_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def test_lengths_share_a_power_of_two_bucket():
    assert [length_bucket(n) for n in (1, 256, 257, 512, 513, 100_000)] == [256, 256, 512, 512, 1024, 131072]
    assert length_bucket(3, minimum=1) == 4
    with pytest.raises(ValueError, match="length"):
        length_bucket(0)


def test_interpreter_and_cpu_use_the_first_config_without_measuring(tmp_path):
    assert interpreter_active()  # tests/conftest.py sets TRITON_INTERPRET=1
    launched = []
    cache = AutotuneCache(tmp_path / "cache.json")
    chosen = choose_config("screen", [LARGE, SMALL], launched.append, device=torch.device("cpu"),
                           length=5000, shape={"heads": 8}, work=MIN_TUNED_WORK, cache=cache)
    assert chosen == LARGE and launched == [] and not (tmp_path / "cache.json").exists()


class Tuning(Exception):
    """Raised by a launch: the candidates are being compiled and measured."""


def test_a_small_call_on_the_gpu_takes_the_first_config_without_compiling_the_others(tmp_path, monkeypatch):
    # A first call at a new shape compiles every candidate it measures (seconds each for the larger
    # kernels): a call with less work than MIN_TUNED_WORK, whose run time no config changes much,
    # must not pay that. Outside the interpreter, as on a CUDA device:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    launched = []
    cache = AutotuneCache(tmp_path / "cache.json")
    cuda = torch.device("cuda", 0)
    for _ in range(2):
        assert choose_config("screen", [LARGE, SMALL], launched.append, device=cuda, length=5000,
                             shape={"heads": 8, "case": 1}, work=MIN_TUNED_WORK - 1, cache=cache) == LARGE
    assert launched == [LARGE]  # launched once to know that it launches, then remembered

    def launch(config):
        raise Tuning(config)

    with pytest.raises(Tuning):
        choose_config("screen", [LARGE, SMALL], launch, device=cuda, length=5000, shape={"heads": 8},
                      work=MIN_TUNED_WORK, cache=cache)
    with pytest.raises(ValueError, match="work: expected an int >= 0"):
        choose_config("screen", [LARGE, SMALL], launch, device=cuda, length=5000, shape={}, work=-1, cache=cache)


def test_a_small_call_skips_a_first_config_the_device_cannot_launch(tmp_path, monkeypatch):
    # e.g. the screen's first candidate at r = 64 asks for more shared memory than a Hopper block has
    from triton.runtime.errors import OutOfResources

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    launched = []

    def launch(config):
        launched.append(config)
        if config == LARGE:
            raise OutOfResources(245760, 232448, "shared memory")

    cuda = torch.device("cuda", 0)
    for _ in range(2):
        assert choose_config("screen", [LARGE, SMALL], launch, device=cuda, length=50, shape={"RP": 128},
                             work=1, cache=AutotuneCache(tmp_path / "cache.json")) == SMALL
    assert launched == [LARGE, SMALL]
    with pytest.raises(OutOfResources):
        choose_config("screen", [LARGE], launch, device=cuda, length=50, shape={"RP": 256}, work=1,
                      cache=AutotuneCache(tmp_path / "cache.json"))


def test_fastest_config_is_the_one_with_the_least_measured_time():
    def launch(config):
        n = dict(config.meta)["BLOCK_T"]
        torch.sort(torch.rand(n * 200))

    assert fastest_config([LARGE, SMALL], launch, wall_clock_ms) == SMALL
    assert fastest_config([SMALL, LARGE], launch, wall_clock_ms) == SMALL


def test_fastest_config_skips_a_candidate_that_fails_to_launch():
    def launch(config):
        if config == LARGE:
            raise RuntimeError("out of shared memory")

    assert fastest_config([LARGE, SMALL], launch, wall_clock_ms) == SMALL
    with pytest.raises(RuntimeError, match="shared memory"):
        fastest_config([LARGE], launch, wall_clock_ms)


def test_cache_entries_survive_a_reload_and_a_corrupt_file_is_replaced(tmp_path):
    path = tmp_path / "sub" / "cache.json"
    AutotuneCache(path).put("screen|bucket=1024", LARGE)
    assert AutotuneCache(path).get("screen|bucket=1024") == LARGE
    path.write_text("{ not json")
    cache = AutotuneCache(path)
    assert cache.get("screen|bucket=1024") is None
    cache.put("refine|bucket=2048", SMALL)
    assert AutotuneCache(path).get("refine|bucket=2048") == SMALL


def test_keys_separate_kernels_buckets_and_shapes():
    cpu = torch.device("cpu")
    a = tuning_key("screen", cpu, length_bucket(3000), {"heads": 64, "head_dim": 128})
    assert a == tuning_key("screen", cpu, length_bucket(4096), {"head_dim": 128, "heads": 64})
    assert a != tuning_key("screen", cpu, length_bucket(5000), {"heads": 64, "head_dim": 128})
    assert a != tuning_key("refine", cpu, length_bucket(3000), {"heads": 64, "head_dim": 128})
    assert a != tuning_key("screen", cpu, length_bucket(3000), {"heads": 32, "head_dim": 128})


def test_launch_configs_round_trip_and_reject_bad_values():
    assert LaunchConfig.from_dict(LARGE.to_dict()) == LARGE
    assert LARGE.kwargs() == {"BLOCK_T": 4096, "num_warps": 8, "num_stages": 3}
    with pytest.raises(ValueError, match="num_warps"):
        LaunchConfig.of(num_warps=0)
    with pytest.raises(TypeError, match="BLOCK_T"):
        LaunchConfig.of(BLOCK_T=16.0)
    with pytest.raises(ValueError, match="configs"):
        fastest_config([], lambda c: None, wall_clock_ms)
