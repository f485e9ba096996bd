"""edge.infer.postprocess: logits -> softmax -> top-k with labels; a non-finite output is a failed frame, and a
labels file is refused by its line."""

import numpy as np
import pytest

from edge.errors import EdgeError
from edge.infer.postprocess import TopK, load_labels


def test_topk_matches_numpy_softmax():
    logits = np.random.default_rng(0).normal(size=(1, 10)).astype(np.float32)
    pred = TopK(["c{}".format(i) for i in range(10)], k=3)(logits)
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    order = np.argsort(-probs)[:3]
    assert pred.indices == list(order)
    assert pred.labels == ["c{}".format(i) for i in order]
    assert np.allclose(pred.scores, probs[order], atol=1e-6)


def test_topk_refuses_a_non_finite_output_and_takes_the_largest_finite_ones():
    labels = ["c{}".format(i) for i in range(1000)]
    huge = np.full((1, 1000), 3e38, np.float32)  # their float32 sum overflows; every value is finite
    huge[0, 7] = 3.4e38
    assert TopK(labels)(huge).indices[0] == 7
    for bad in (np.nan, np.inf, -np.inf):
        logits = huge.copy()
        logits[0, 500] = bad
        with pytest.raises(ValueError, match=r"non-finite model output \(1 of 1000 values"):
            TopK(labels)(logits)


HOSTILE_LABELS = [
    (b"\xef\xbb\xbfcat\ndog\n", None),  # a BOM is dropped, not part of the first label
    (b"cat\n  \ndog\n", "line 2"), (b"cat\n\t\ndog\n", "line 2"), (b"cat\ndog\n\n", "line 3"),
    (b"cat\n\x1b[31mdog\n", "line 2"), (b"cat\ndo\x00g\n", "line 2"), (b"cat\ndog\xc2\x85x\n", "line 2"),
    (b"cat\ndog\xe2\x80\xaex\n", "line 2"), (b"\xef\xbb\xbf\n", "line 1"), (b"cat\xff\n", "not UTF-8"),
]


@pytest.mark.parametrize("content, says", HOSTILE_LABELS)
def test_labels_with_control_characters_or_blank_lines_are_refused_by_line(tmp_path, content, says):
    path = tmp_path / "m.labels.txt"
    path.write_bytes(content)
    if says is None:
        assert load_labels(str(path)) == ["cat", "dog"]
        return
    with pytest.raises(EdgeError) as err:
        load_labels(str(path))
    assert str(path) in str(err.value) and says in str(err.value) and "\x1b" not in str(err.value)


def test_a_labels_path_that_is_a_folder_is_one_line(tmp_path):
    with pytest.raises(EdgeError, match="labels file.*folder"):
        load_labels(str(tmp_path))
