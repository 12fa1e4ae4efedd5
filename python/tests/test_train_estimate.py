"""strata.train and strata.estimate: the CLI's library functions from Python, returning Python
objects, with Strata's errors as strata.StrataError."""
import json
import os
import pathlib

import pytest

strata = pytest.importorskip("strata") if not os.environ.get("STRATA_REQUIRE_PYTHON") else \
    __import__("strata")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo-small.json"


def test_estimate_returns_the_json_report_as_a_dict():
    report = strata.estimate(DEMO, params="1B", host_bytes="4GiB")
    assert report["params"] == 1_000_000_000
    assert {v["tier"] for v in report["verdicts"]} >= {"host"}
    host = next(v for v in report["verdicts"] if v["tier"] == "host")
    assert host["budget_bytes"] == 4 << 30
    assert report["fits"] == all(v["fits"] for v in report["verdicts"])
    assert report["nvme_bytes"] > 0  # the demo offloads to NVMe
    assert sum(i["bytes"] for i in report["items"] if i["tier"] == "nvme") == report["nvme_bytes"]


def test_estimate_of_a_dict_config_and_overrides():
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    on_host = strata.estimate(config, params="100M")
    assert on_host["nvme_bytes"] == 0
    # 12 bytes of fp32 master and moments per parameter at least sit on the host.
    assert on_host["host_bytes"] >= 12 * 100_000_000


def test_estimate_errors_name_the_argument_and_the_key(tmp_path):
    with pytest.raises(strata.StrataError, match="params"):
        strata.estimate(DEMO, params="lots")
    with pytest.raises(strata.StrataError, match="host_bytes"):
        strata.estimate(DEMO, params="1B", host_bytes="-3")
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 7}}')
    with pytest.raises(strata.StrataError, match=r"bad\.json.*zero_optimization\.stage"):
        strata.estimate(bad, params="1B")
    with pytest.raises(strata.StrataError, match="missing.json"):
        strata.estimate(tmp_path / "missing.json", params="1B")


def test_train_runs_a_job_and_returns_its_summary(tmp_path):
    out = tmp_path / "run"
    result = strata.train(DEMO, {"strata.output_dir": str(out),
                                 "zero_optimization.offload_param.nvme_path": str(out / "nvme"),
                                 "zero_optimization.offload_optimizer.nvme_path": str(out / "nvme"),
                                 "strata.eval_every_steps": 0},
                          quiet=True, strata__train_steps=3)
    assert result["stopped_by"] is None
    assert result["step"] == 3
    summary = result["summary"]
    assert summary["steps"] == 3 and summary["skipped_steps"] == 0
    assert summary["final_loss"] > 0 and summary["nvme_bytes_peak"] > 0
    last = json.loads((out / "metrics.jsonl").read_text().strip().splitlines()[-1])
    assert last == summary
    assert (out / "final" / "config.json").exists()
    assert (out / "effective_config.json").exists()


def test_train_errors_arrive_as_strata_errors(tmp_path):
    with pytest.raises(strata.StrataError, match="strata.train_steps"):
        strata.train(DEMO, {"strata.output_dir": str(tmp_path / "x"), "strata.train_steps": -1},
                     quiet=True)
