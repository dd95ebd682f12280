"""Emulated host devices and jax.distributed: two local processes equal one process with two devices."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from remat_lab.config import ConfigError
from remat_lab.program.distributed import parse_host_devices, setup

SRC = str(Path(__file__).resolve().parents[1] / "src")
RUN = ["run", "--mesh", "data=2", "--model", "mlp", "--width", "32", "--batch", "8", "--depth", "2",
       "--policy", "nothing_saveable", "--repeats", "1", "--warmup", "0", "--json"]


def _env(tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "REMAT_LAB_CACHE_DIR": str(tmp_path / "cache")}
    for key in ("XLA_FLAGS", "REMAT_LAB_HOST_DEVICES"):
        env.pop(key, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("text", ["0", "-1", "two", "513", "1e3", "٣"])
def test_host_devices_must_be_a_small_whole_number(text):
    with pytest.raises(ConfigError, match="host devices must be a whole number from 1 to 512"):
        parse_host_devices(text)


@pytest.mark.parametrize("text", ["0000019999", "01", "0004"])
def test_host_devices_with_leading_zeros_are_refused(text):
    """Only plain decimals: a leading-zero count once passed the range check on its first digits."""
    with pytest.raises(ConfigError, match="host devices must be a whole number from 1 to 512"):
        parse_host_devices(text)


def test_a_partial_multi_process_setup_is_refused():
    with pytest.raises(ConfigError, match="needs all of --coordinator"):
        setup(None, None, 2, None)


def test_the_environment_variable_sets_the_devices_before_jax_starts(tmp_path):
    code = ("from remat_lab.program.distributed import apply_env; n = apply_env(); import jax; "
            "print(n, jax.device_count())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**_env(tmp_path), "REMAT_LAB_HOST_DEVICES": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "3"]


def test_two_processes_equal_one_process_with_two_devices(tmp_path):
    env = _env(tmp_path)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "remat_lab", *RUN, "--coordinator",
                               f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert outs[1][0] == ""  # process 1 exits quietly; process 0 prints the document
    two = json.loads(outs[0][0])
    one_done = subprocess.run([sys.executable, "-m", "remat_lab", *RUN, "--host-devices", "2"],
                              env=env, capture_output=True, text=True, timeout=300)
    assert one_done.returncode == 0, one_done.stderr[-3000:]
    one = json.loads(one_done.stdout)
    assert two["sharding"]["processes"] == 2 and one["sharding"]["processes"] == 1
    assert two["sharding"]["devices"] == one["sharding"]["devices"] == 2
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    assert two["sharding"]["grad_norm"] == pytest.approx(one["sharding"]["grad_norm"], rel=1e-6)
    assert two["gradient_check"]["ok"] and one["gradient_check"]["ok"]
    assert two["sharding"]["collective_counts"] == one["sharding"]["collective_counts"]
