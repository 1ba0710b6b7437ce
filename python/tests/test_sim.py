# vlsparse.sim.run: the simulator's run and compare as functions returning the JSON report.
import json
import os
import subprocess

import pytest

import vlsparse

SMALL = {
    "name": "python-test",
    "model": {"layers": 3, "heads": 4, "kv_heads": 2, "head_dim": 32},
    "layout": "text:10,text:1,image:64[8x8],text:1,text:12",
    "decode_steps": 3,
    "source": {"kind": "synthetic"},
    "policies": [{"name": "zipvl", "params": {"tau": 0.9}}, {"name": "h2o", "params": {"heavy": 0.2, "recent": 0.1}},
                 {"name": "blindsight", "params": {"template": "Document-Sink"}}],
    "backend": "cpu",
    "seed": 3,
}


def test_run_dict():
    r = vlsparse.sim.run(SMALL)
    assert r["format"] == "vlsparse.sim.report" and r["command"] == "run"
    assert r["scenario"]["model"]["layers"] == 3
    names = [run["name"] for run in r["runs"]]
    assert len(names) == 4 and names[0] == "dense", names
    assert json.dumps(r)  # plain JSON types


def test_run_path_with_sets_and_compare(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    r = vlsparse.sim.run(path, sets=["decode_steps=2", "model.layers=2"])
    assert r["scenario"]["decode_steps"] == 2 and r["scenario"]["model"]["layers"] == 2
    small = dict(SMALL, policies=[{"name": "zipvl", "params": {}, "sweep": {"param": "tau", "values": [0.9, 0.99]}}])
    c = vlsparse.sim.run(small, command="compare")
    assert c["command"] == "compare" and len(c["runs"]) == 3


def test_default_scenario():
    s = vlsparse.sim.default_scenario()
    assert s["name"] == "default" and len(s["policies"]) == 10


def without_times(x):
    """The report without what differs between two runs of one scenario: times, rates and thread counts."""
    if isinstance(x, dict):
        return {k: without_times(v) for k, v in x.items() if not k.endswith("_s") and k not in ("threads", "gflops", "prefill_tflops", "decode_gbps")}
    if isinstance(x, list):
        return [without_times(v) for v in x]
    return x


@pytest.mark.skipif(not os.path.isfile(os.environ.get("VLSPARSE_SIM", "")),
                    reason="vlsparse-sim not built (-Dsimulator=false, or not compiled yet): no file at $VLSPARSE_SIM")
def test_run_is_the_simulators_report(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    cli = tmp_path / "cli.json"
    # sim.run is `run --no-sweep`: the one-seed budget sweep that `run` adds for its report is not run.
    subprocess.run([os.environ["VLSPARSE_SIM"], "run", str(path), "--json", str(cli), "--no-html", "--quiet", "--no-sweep"],
                   check=True, capture_output=True)
    expected = without_times(json.loads(cli.read_text()))
    got = without_times(vlsparse.sim.run(path))
    assert got == expected
