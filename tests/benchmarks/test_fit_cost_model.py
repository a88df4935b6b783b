"""The offline refit of the cost model's H200 constants (benchmarks/fit_cost_model.py) on the
committed H200 results: valid, loadable constants, and an offline plan replay that reproduces the
plans the zoo's GPU run recorded."""
import json
from pathlib import Path

from benchmarks import fit_cost_model
from compiler.cost_model import H200_FITTED, KernelConstants
from compiler.topk_settings import TopkSettings

RESULTS = Path(fit_cost_model.__file__).resolve().parent / "results"


def test_the_refit_is_loadable_and_fits_the_certified_calls(tmp_path, monkeypatch):
    out = tmp_path / "refit.json"
    fits = []  # what main's fit of the committed roofline and zoo results returned (the real fit)
    real_fit = fit_cost_model.fit
    monkeypatch.setattr(fit_cost_model, "fit", lambda *args: fits.append(real_fit(*args)) or fits[-1])
    assert fit_cost_model.main(["--out", str(out)]) == 0
    constants = KernelConstants.from_json(out)  # what `python -m compiler.plan --constants FILE` loads
    assert constants.screen_pow2 == H200_FITTED.screen_pow2 and constants.screen_tile == H200_FITTED.screen_tile
    assert "max relative error" in constants.source
    text = out.with_suffix(".md").read_text()
    assert "| structured |" in text and "| mixture |" in text
    ((fitted, report),) = fits
    assert fitted.to_dict() == constants.to_dict()
    assert report["points"] >= 40 and report["rms_rel_error"] < 0.25


def test_the_offline_replay_reproduces_the_zoos_recorded_plans():
    """Plans decided offline from the zoo's calibration measurements with the constants its run used
    (recorded in its results) equal the plans that run made on the GPU (path, r, min_keys): the
    refit's plans are comparable."""
    zoo = json.loads((RESULTS / "indexer_zoo_h200.json").read_text())
    replay = fit_cost_model.zoo_plans(zoo, KernelConstants.from_dict(zoo["constants"]))
    for family, plan in zoo["plans"].items():
        settings = TopkSettings(replay[family]["path"], replay[family]["r"], replay[family]["min_keys"])
        assert settings == fit_cost_model.recorded_settings(plan), family
