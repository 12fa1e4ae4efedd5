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


def _tiny_run_config(out, steps):
    """A tiny Llama run on synthetic data (seconds on the CPU)."""
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
            "strata": {"output_dir": str(out), "train_steps": steps, "seed": 7, "cpu_threads": 1,
                       "device_bytes_max": "256MiB", "host_bytes_max": "256MiB",
                       "eval_batches": 1, "checkpoint_every_steps": 2,
                       "model": {"family": "llama", "vocab_size": 64, "max_seq_len": 32,
                                 "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                                 "num_kv_heads": 2},
                       "data": {"source": "synthetic", "seq_len": 16,
                                "synthetic_vocab_size": 64, "synthetic_branching": 3}}}


class _Barrier:
    """The test's side of STRATA_TEST_BARRIER (src/common/fault_points.h)."""

    def __init__(self, folder):
        self.folder = folder
        os.mkfifo(folder / "arrive")
        os.mkfifo(folder / "go")
        self._arrive = os.open(folder / "arrive", os.O_RDONLY | os.O_NONBLOCK)
        self._seen = 0

    def env(self, point):
        return f"{point}:{self.folder}"

    def wait_arrival(self, timeout_s=120):
        import select
        import time
        deadline = time.monotonic() + timeout_s
        while self._seen < 1 and time.monotonic() < deadline:
            ready, _, _ = select.select([self._arrive], [], [], 0.1)
            if ready:
                data = os.read(self._arrive, 256)
                self._seen += data.count(b"\n")
                if not data:
                    time.sleep(0.002)
        return self._seen >= 1

    def release(self):
        fd = os.open(self.folder / "go", os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"g")
        os.close(fd)
        os.close(self._arrive)


def test_train_takes_the_output_directory_lock_like_the_cli(tmp_path):
    import subprocess
    import threading
    out = tmp_path / "run"
    config = tmp_path / "c.json"
    config.write_text(json.dumps(_tiny_run_config(out, 4)))
    strata_bin = os.environ.get("STRATA_BIN", str(ROOT / "build" / "strata"))
    env = {k: v for k, v in os.environ.items() if k != "STRATA_TEST_BARRIER"}

    # A `strata train` process holds the directory: strata.train from Python is refused, naming it.
    (tmp_path / "b1").mkdir()
    barrier = _Barrier(tmp_path / "b1")
    holder = subprocess.Popen([strata_bin, "train", "--config", str(config), "--quiet"],
                              env={**env, "STRATA_TEST_BARRIER": barrier.env("lock.held")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert barrier.wait_arrival(), holder.stderr.read() if holder.poll() is not None else ""
        with pytest.raises(strata.StrataError,
                           match=rf"is in use by another Strata process: pid {holder.pid} "):
            strata.train(config, quiet=True)
    finally:
        barrier.release()
        _, err = holder.communicate(timeout=300)
    assert holder.returncode == 0, err
    assert not (out / ".strata.lock").exists()

    # strata.train holds it: a `strata train` process started meanwhile is refused, naming us.
    (tmp_path / "b2").mkdir()
    barrier = _Barrier(tmp_path / "b2")
    result = {}

    def run():
        try:
            result["value"] = strata.train(config, quiet=True, strata__train_steps=6,
                                           strata__overwrite_output_dir=True)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            result["error"] = e

    os.environ["STRATA_TEST_BARRIER"] = barrier.env("lock.held")
    thread = threading.Thread(target=run)
    try:
        thread.start()
        assert barrier.wait_arrival()
        del os.environ["STRATA_TEST_BARRIER"]
        refused = subprocess.run([strata_bin, "train", "--config", str(config), "--quiet",
                                  "--overwrite"], env=env, capture_output=True, text=True,
                                 timeout=300)
    finally:
        os.environ.pop("STRATA_TEST_BARRIER", None)
        barrier.release()
        thread.join(timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert f"is in use by another Strata process: pid {os.getpid()} " in refused.stderr
    assert "error" not in result, result.get("error")
    assert result["value"]["step"] == 6
