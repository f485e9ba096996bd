"""The CPU preprocessor against torchvision's eval transform on real photographs."""

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor, axis_weights, crop_geometry

PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "cat"]


def torchvision_reference(rgb):
    import torchvision.transforms as T
    from PIL import Image

    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    return tf(Image.fromarray(rgb)).numpy()


@pytest.mark.parametrize("name", PHOTOS)
def test_matches_torchvision_on_photographs(name):
    import skimage.data

    rgb = getattr(skimage.data, name)()
    out = CpuPreprocessor(PreprocessConfig())(np.ascontiguousarray(rgb[:, :, ::-1]))
    diff = np.abs(out[0] - torchvision_reference(rgb))
    # PIL rounds to uint8 after each pass; one grey level is ~0.017 in normalised units.
    assert diff.mean() < 0.01
    assert diff.max() < 0.05


def test_matches_torchvision_on_a_720p_frame():
    import cv2
    import skimage.data

    bgr = cv2.resize(np.ascontiguousarray(skimage.data.astronaut()[:, :, ::-1]), (1280, 720),
                     interpolation=cv2.INTER_CUBIC)
    out = CpuPreprocessor(PreprocessConfig())(bgr)
    diff = np.abs(out[0] - torchvision_reference(np.ascontiguousarray(bgr[:, :, ::-1])))
    assert diff.mean() < 0.01


@pytest.mark.parametrize("w,h", [(1280, 720), (720, 1280), (3840, 2160), (451, 300), (224, 224), (7, 5), (1, 1)])
def test_geometry_matches_torchvision(w, h):
    import torch
    import torchvision.transforms.functional as F

    g = crop_geometry(w, h, resize=256, crop=224)
    new_h, new_w = F.resize(torch.zeros(1, h, w), 256, antialias=True).shape[1:]
    assert (g.src_w / g.scale_x, g.src_h / g.scale_y) == pytest.approx((new_w, new_h))
    assert g.offset_y == int(round((new_h - 224) / 2.0)) and g.offset_x == int(round((new_w - 224) / 2.0))


@pytest.mark.parametrize("w,h", [(720, 1280), (3840, 2160), (7, 5), (1, 1), (300, 100)])
def test_odd_sizes_give_finite_normalised_output(w, h):
    frame = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = CpuPreprocessor(PreprocessConfig())(frame)
    assert out.shape == (1, 3, 224, 224) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert out.min() >= (0 - 0.485) / 0.229 - 1e-4 and out.max() <= (1 - 0.406) / 0.225 + 1e-4


def test_constant_frame_gives_exact_normalised_value():
    out = CpuPreprocessor(PreprocessConfig())(np.full((480, 640, 3), (10, 20, 30), np.uint8))
    expected = (np.array([30, 20, 10]) / 255.0 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    assert np.abs(out[0] - expected[:, None, None]).max() < 1e-5  # RGB order, weights sum to 1


def test_weights_rows_sum_to_one():
    import torch
    import torchvision.transforms.functional as F

    # one axis of a 1280-wide frame resized to 455 and cropped to 224 from 116
    matrix, first = axis_weights(224, offset=116, scale=1280 / 455, in_size=1280)
    assert np.allclose(matrix.sum(axis=1), 1.0, atol=1e-6)
    # the source window [first, first + span) is where those 224 samples come from: torchvision's resize and crop
    line = np.random.default_rng(0).random(1280)
    expected = F.resize(torch.from_numpy(line).reshape(1, 1, -1), [1, 455], antialias=True)[0, 0, 116:116 + 224]
    assert np.allclose(matrix @ line[first:first + matrix.shape[1]], expected.numpy(), atol=1e-5)


def test_rejects_wrong_frames():
    pre = CpuPreprocessor(PreprocessConfig())
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        pre(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        pre(np.zeros((10, 10, 3), np.float32))


# --- preprocessing constants travel with the model (edge.infer.preprocess.model_preprocess) ---------------------

EFFNET = {"resize": 256, "crop": 224, "mean": [127 / 255] * 3, "std": [128 / 255] * 3}


def test_model_info_constants_replace_config_defaults():
    from edge.infer.preprocess import model_preprocess

    got = model_preprocess(PreprocessConfig(device="cpu"), {"preprocess": EFFNET}, "m.onnx", "c.yaml")
    assert (got.device, got.resize, got.crop, got.mean, got.std) == ("cpu", 256, 224, EFFNET["mean"], EFFNET["std"])
    same = PreprocessConfig(mean=[0.498039] * 3, std=[0.501961] * 3)  # the model's values, as a YAML file spells them
    assert model_preprocess(same, {"preprocess": EFFNET}, "m.onnx", "c.yaml").mean == EFFNET["mean"]
    mine = PreprocessConfig(mean=[0.5, 0.4, 0.3])
    assert model_preprocess(mine, {"trained": True}, "m.onnx", "c.yaml") is mine  # no constants: the config's


@pytest.mark.parametrize("key, value", [("mean", [0.5, 0.5, 0.5]), ("std", [0.25] * 3), ("resize", 288),
                                        ("crop", 192)])
def test_a_config_value_contradicting_the_model_is_one_line(key, value):
    from edge.errors import EdgeError
    from edge.infer.preprocess import model_preprocess

    with pytest.raises(EdgeError) as err:
        model_preprocess(PreprocessConfig(**{key: value}), {"preprocess": EFFNET}, "m.onnx", "c.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("c.yaml: 'preprocess.{}'".format(key)) and "m.json" in text


@pytest.mark.parametrize("bad", [{"resize": 256}, dict(EFFNET, std=[0.5, 0.0, 0.5]), dict(EFFNET, crop=300),
                                 dict(EFFNET, mean="grey"), dict(EFFNET, resize=256.5)])
def test_an_impossible_model_info_is_refused(bad):
    from edge.errors import EdgeError
    from edge.infer.preprocess import model_preprocess

    with pytest.raises(EdgeError, match=r"^m\.json: "):
        model_preprocess(PreprocessConfig(), {"preprocess": bad}, "m.onnx", "c.yaml")


def test_memory_stays_bounded_over_frames_of_many_sizes():
    """A folder of photographs of distinct sizes (issue 19 item 14: 30 photos peaked at 1.19 GB): the per-size
    plans are bounded, measured as the memory NumPy holds (tracemalloc), and the output stays exact."""
    import tracemalloc

    from edge.infer.preprocess import MAX_PLANS

    cfg = PreprocessConfig()
    sizes = [(1200 + 16 * i, 900 + 8 * i) for i in range(10)]
    frames = [np.random.default_rng(i).integers(0, 256, (h, w, 3), np.uint8) for i, (w, h) in enumerate(sizes)]
    pre = CpuPreprocessor(cfg)
    tracemalloc.start()
    try:
        pre(frames[0])
        one_plan = tracemalloc.get_traced_memory()[0]
        for frame in frames[1:]:
            pre(frame)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < (MAX_PLANS + 0.5) * one_plan, (held, one_plan)  # 10 sizes, at most MAX_PLANS plans kept
    for frame in (frames[0], frames[-1]):  # an evicted size and a kept one: the same result as a fresh plan
        np.testing.assert_array_equal(pre(frame), CpuPreprocessor(cfg)(frame))
