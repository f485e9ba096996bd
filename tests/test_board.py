"""edge.board: the L4T release read from /etc/nv_tegra_release, and what a machine without a Jetson says it is."""

from edge.board import current_system, read_l4t


def test_read_l4t(tmp_path):
    release = tmp_path / "etc" / "nv_tegra_release"
    release.parent.mkdir()
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: ...\n",
                       encoding="utf-8")
    assert read_l4t(str(tmp_path)) == "R36.4.3"
    assert read_l4t(str(tmp_path / "missing")) is None


def test_current_system_on_this_cpu_machine():
    import onnxruntime

    system = current_system(root="/nonexistent")
    assert system["onnxruntime"] == onnxruntime.__version__
    assert system["l4t"] is None
    assert system["tensorrt"] is None  # tensorrt-stubs installs a `tensorrt` package without a runtime
    assert set(system) >= {"tensorrt", "gpu", "compute_capability", "l4t", "onnxruntime", "machine"}
