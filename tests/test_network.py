"""A GPU target's host network: the machine decides the figure across hosts (A3 High's is half A3
Mega's), a configuration names it, its collectives across hosts are priced at it, and the published
A3 runs are checked on the one they were measured on."""

import json
import shlex
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, RunConfig, get_target
from remat_lab.config import published as pub
from remat_lab.config.cli_flags import run_command

ROOT = Path(__file__).resolve().parents[1]
# two H100 hosts of 8 GPUs, a small llm: its gradients are all-reduced across the hosts
TWO_HOSTS = dict(model="llm", width=256, heads=4, vocab=512, seq=64, batch=16, depth=2,
                 dtype="bfloat16", step="train", compile_only=True, target="h100", target_devices=16,
                 mesh="dcn_data=2,fsdp=8")


def test_a_network_is_one_the_target_names_with_its_source():
    mega, high, dgx = (get_target("h100", n) for n in ("a3-mega", "a3-high", "dgx-h100"))
    assert get_target("h100") == mega and mega.network == "a3-mega"
    assert (mega.dcn_bytes_per_s, high.dcn_bytes_per_s, dgx.dcn_bytes_per_s) == (25e9, 12.5e9, 50e9)
    # four 200 Gb/s NICs for eight GPUs: 800e9 / 8 bits a second
    assert high.dcn_bytes_per_s == 4 * 200e9 / 8 / 8 and "a3-highgpu-8g" in high.dcn_source
    assert (high.peak_flops, high.interconnect_bytes_per_s) == (mega.peak_flops,
                                                                mega.interconnect_bytes_per_s)
    with pytest.raises(ConfigError, match="a3-mega, a3-high, dgx-h100"):
        get_target("h100", "a3-ultra")
    with pytest.raises(ConfigError, match="none but its default"):
        get_target("tpu-v6e", "a3-high")
    with pytest.raises(ConfigError, match="named target"):
        RunConfig(network="a3-high")  # local: this machine's own network
    assert RunConfig(**TWO_HOSTS, network="a3-high").network == "a3-high"


def test_the_network_prices_the_collectives_across_hosts_and_the_command_keeps_it():
    """One compile, priced on two networks: the roofline's cross-host term is its ring bytes over
    the network, exactly twice as long at half the bandwidth; the prediction's collectives grow with
    it; the command that reproduces the numbers names the network. (That a check's document is
    priced on its run's network: the stored A3 checks, below.)"""
    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.analysis.predict import predict_step
    from remat_lab.cli import build_parser
    from remat_lab.cli.common import config_from
    from remat_lab.studies.advisor.search import probe

    config = RunConfig(**TWO_HOSTS, network="a3-high")
    found = probe(config)
    priced = {}
    for network in ("a3-mega", "a3-high"):
        target = get_target("h100", network)
        est = estimate_step(found["flops"], found["bytes_accessed"], target, config.dtype, found["traffic"])
        priced[network] = (est, predict_step(target, est, kernels=found["kernels"], events=found["schedule"]))
    (mega, mega_pred), (high, high_pred) = priced["a3-mega"], priced["a3-high"]
    assert mega["collectives_dcn_s"] > 0 and mega["dcn_bytes_per_s"] == 25e9
    assert high["collectives_dcn_s"] == pytest.approx(2 * mega["collectives_dcn_s"], rel=1e-12)
    assert high["collectives_ici_s"] == pytest.approx(mega["collectives_ici_s"], rel=1e-12)
    assert high_pred["scheduled_collectives_s"] > mega_pred["scheduled_collectives_s"]
    assert high_pred["predicted_s"] >= mega_pred["predicted_s"]
    command = run_command(config)
    assert "--network a3-high" in command
    args = build_parser().parse_args(shlex.split(command)[3:])
    assert config_from(args).network == "a3-high"
    assert "--network" not in run_command(RunConfig(**TWO_HOSTS))  # the default is not written


def test_the_a3_runs_are_checked_on_a3_high_the_machine_they_ran_on():
    a3 = [n for n in pub.RUNS if n.startswith("llama2-7b-a3-")]
    assert len(a3) == 5
    for name in a3:
        run = pub.RUNS[name]
        assert run["network"] == "a3-high" and "h100-80gb-8" in run["network_note"]
        fields, _ = pub.translate(run)
        assert fields["network"] == "a3-high"
        doc = json.loads((ROOT / "benchmarks" / "published_checks" / f"{name}.json").read_text())
        assert doc["config"]["network"] == "a3-high", name
        assert doc["network"]["dcn_bytes_per_s"] == 12.5e9, name
        if "dcn_" in doc["config"]["mesh"]:
            assert doc["estimate_terms"]["dcn_bytes_per_s"] == 12.5e9, name
    # a TPU run names none: its slices meet over the data-centre network of its target
    assert "network" not in pub.translate(pub.RUNS["llama3.1-405b-v6e-256x2"])[0]


def _opened(page: str, **params: str):
    """``pages/PAGE`` opened by a link to two H100 hosts of a small mlp (``params`` added), run once."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=180)
    for key, value in {"target": "h100", "mesh": "dcn_data=2,fsdp=8", "width": "64", "batch": "16",
                       "depth": "1", **params}.items():
        at.query_params[key] = value
    return at.run()


def test_the_sidebar_offers_the_host_network_and_a_link_keeps_it():
    pytest.importorskip("streamlit")
    at = _opened("explore.py", network="a3-high")
    assert not at.exception, at.exception
    box = at.selectbox(key="mesh_network")
    assert box.value == "a3-high" and box.options[0].startswith("a3-mega (25 GB/s a GPU)")
    assert at.query_params["network"] == "a3-high"
    box.set_value("a3-mega").run()
    assert "network" not in at.query_params  # the default: not written
    bad = _opened("explore.py", network="<b>x</b>")
    assert not bad.exception
    assert any("URL parameter `network`" in w.value and "<b>" not in w.value for w in bad.warning)
    assert bad.selectbox(key="mesh_network").value == "a3-mega"


def test_the_targets_page_with_a_mesh_across_hosts_says_it_compares_one_device_each():
    """It raised ConfigError (a traceback) before: the page builds its local configuration from
    the sidebar's, and a dcn mesh (or a host network) is a named target's only."""
    pytest.importorskip("streamlit")
    at = _opened("targets.py", network="a3-high")
    assert not at.exception, at.exception
    assert any("spans hosts or slices" in w.value for w in at.warning)
