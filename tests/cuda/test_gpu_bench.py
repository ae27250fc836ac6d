"""scripts/gpu_bench.py: its tables and targets, and its nblstm paths in the CUDA simulator.

The script's PyTorch (cuDNN), profiler and compute-sanitizer parts need a
real GPU; ``--sim-smoke`` runs the rest on a tiny shape with Numba device
arrays: every loop variant of the ops against the CPU target, the sanitizer
child's cases in-process, the Markdown and JSON it writes.
"""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("numba.cuda", reason="needs numba-cuda")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_bench", None)


def test_loop_variants(bench):
    config = SimpleNamespace(PERSISTENT="auto", RESIDENT="auto", STEP_GEMM="auto", PERSISTENT_MAX_BATCH=16)
    labels = [label for label, _ in bench.loop_variants(config, 4)]
    assert labels == ["default", "resident", "gemm-steps", "tiled persistent", "tiled per-step"]
    settings = dict(bench.loop_variants(config, 4))
    assert settings["tiled persistent"] == {"PERSISTENT": True, "RESIDENT": False, "STEP_GEMM": False}
    assert "tiled persistent" not in dict(bench.loop_variants(config, 17))
    older = SimpleNamespace(PERSISTENT="auto", PERSISTENT_MAX_BATCH=16)
    assert [label for label, _ in bench.loop_variants(older, 1)] == ["default"]
    assert bench.variant_precisions("gemm-steps") == bench.PRECISIONS
    assert bench.variant_precisions("tiled per-step") == ("exact",)
    with bench.config_set(config, {"PERSISTENT": False}):
        assert config.PERSISTENT is False
    assert config.PERSISTENT == "auto"


def test_parsing_and_formatting(bench):
    assert bench.parse_shapes("25,1,512,512; 3,2,5,4") == ((25, 1, 512, 512), (3, 2, 5, 4))
    with pytest.raises(Exception, match="T,B,I,H"):
        bench.parse_shapes("1,2,3")
    assert bench.parse_sections("env,compare") == ("env", "compare")
    assert bench.verdict(0.69, 0.7) == "met" and bench.verdict(0.71, 0.7) == "unmet"
    assert bench.verdict(None, 0.7) == "n/a"
    assert bench.reps_for(10.0, 0.25, 5, 200) == 25
    assert bench.reps_for(0.01, 0.25, 5, 200) == 200
    assert bench.reps_for(100.0, 0.25, 5, 200, left_s=1.0) == 5
    log = "ok\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n" \
          "========= ERROR SUMMARY: 2 errors\n"
    assert bench.sanitizer_errors(log) == 2 and len(bench.summary_lines(log)) == 2
    assert bench.sanitizer_errors("no summary") is None
    table = bench.markdown_table(("a", "b"), [(1, "x|y")])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]


def _entry(label, precision, fwd, fwd_bwd, launches=(25, 50), loops=None):
    return {"label": label, "precision": precision, "fwd": {"median_ms": fwd}, "fwd_bwd": {"median_ms": fwd_bwd},
            "errors": {"h_abs": 1e-6, "c_T_abs": 2e-6, "w_grad_rel": 3e-6},
            "launches": {"fwd": launches[0], "bwd": launches[1]}, "loops": loops or {"per-step": 2}}


def test_targets_table(bench):
    shape = [25, 1, 512, 512]
    result = {
        "shape": shape,
        "cudnn": {"off": {"fwd": {"median_ms": 1.0}, "fwd_bwd": {"median_ms": 3.0}},
                  "on": {"fwd": {"median_ms": 1.0}, "fwd_bwd": {"median_ms": 2.0}}},
        "nblstm": [_entry("default", "exact", 0.6, 2.4, (1, 1), {"persistent": 2}),
                   _entry("per-step", "exact", 0.9, 1.8), _entry("persistent", "exact", 0.6, 2.4, (1, 1)),
                   {"label": "default", "precision": "tf32", "na": "n/a: ValueError: no cuBLAS"}],
    }
    result["default_is"] = bench._which_default(result["nblstm"])
    assert result["default_is"] == ["persistent"]
    rows = bench.target_rows([result])
    exact, tf32 = rows
    assert exact[3] == "0.70" and exact[4:8] == ("0.60", "met", "0.80", "unmet")
    assert exact[8] == "0.60 (per-step)"
    assert tf32[5].startswith("n/a")
    rows = bench.compare_rows([result])
    assert rows[0][1] == "default (= persistent)" and rows[0][5] == "0.60" and rows[0][-1] == "1/1"
    assert rows[-1][3].startswith("n/a")
    text = bench.compare_markdown([result], ["a note"])
    assert "### Targets" in text and "- a note" in text


def test_sim_smoke_run(bench, tmp_path):
    """The whole script with --sim-smoke: nblstm's call paths, the reports and results.json."""
    assert bench.main(["--sim-smoke", "--no-watchdog", "--out", str(tmp_path)]) == 0
    for name in ("env", "ceilings", "compare", "profile", "sanitize", "report"):
        assert (tmp_path / f"{name}.md").stat().st_size > 0, name
    assert (tmp_path / "compare.txt").exists()
    data = json.loads((tmp_path / "results.json").read_text())
    sections = data["sections"]
    assert {name: s["status"] for name, s in sections.items()} == {
        "env": "ok", "ceilings": "ok", "compare": "ok", "profile": "skipped", "sanitize": "ok"}
    (result,) = sections["compare"]["data"]["results"]
    assert result["backend"] == "numba" and result["reference"] == "nblstm CPU target"
    exact = [e for e in result["nblstm"] if e["precision"] == "exact"]
    assert [e["label"] for e in exact][0] == "default" and len(exact) >= 3
    for e in exact:
        assert e["fwd"]["median_ms"] > 0 and e["fwd_bwd"]["median_ms"] > 0
        assert e["errors"]["h_abs"] < 1e-5 and e["errors"]["w_grad_rel"] < 1e-5
    in_process = sections["sanitize"]["data"]["in_process"]
    assert in_process["failures"] == 0 and in_process["cases"]
    report = (tmp_path / "report.md").read_text()
    assert "## nblstm against cuDNN" in report and "### Targets" in report


def _fake_torch():
    """The attributes of PyTorch's TF32 switches, without PyTorch."""
    cudnn = SimpleNamespace(allow_tf32=True, rnn=SimpleNamespace(fp32_precision="none"))
    matmul = SimpleNamespace(allow_tf32=False, fp32_precision="none")
    backends = SimpleNamespace(cudnn=cudnn, cuda=SimpleNamespace(matmul=matmul))
    return SimpleNamespace(backends=backends, get_float32_matmul_precision=lambda: "highest")


def test_tf32_switches(bench):
    torch = _fake_torch()
    with bench.torch_tf32(torch, False):
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
        state = bench.tf32_state(torch)
        assert state["torch.backends.cudnn.allow_tf32"] is False
    assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is False
    with bench.torch_tf32(torch, True):
        assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_kernel_rows(bench):
    def event(name, us, device="DeviceType.CUDA"):
        return SimpleNamespace(name=name, device_type=device,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    prof = SimpleNamespace(events=lambda: [event("gemm", 30.0), event("step", 5.0), event("step", 7.0),
                                           event("cudaLaunchKernel", 99.0, "DeviceType.CPU")])
    top, total, count = bench._kernel_rows(prof, top=1)
    assert top == [("gemm", 1, 30.0)] and total == 42.0 and count == 3
