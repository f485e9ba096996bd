"""Which class a labelled folder stands for: a class index (ASCII digits) or a line of the model's labels file.

`str.isdigit` is true for '²' and '①', which `int()` refuses: an index is ASCII digits only. A name that several
lines of the labels file carry (torchvision's ImageNet list has "crane" at 134 and 517, "maillot" at 638 and 639)
cannot say which class its images are: it is refused, naming the lines, never filed under the last one.
"""

from typing import Dict, List, Optional, Sequence

from edge.errors import EdgeError


def is_index(name: str) -> bool:
    return name.isascii() and name.isdigit()


def label_lines(labels: Optional[Sequence[str]]) -> Dict[str, List[int]]:
    """Label text -> every class index whose line carries it."""
    lines: Dict[str, List[int]] = {}
    for i, name in enumerate(labels or []):
        lines.setdefault(name, []).append(i)
    return lines


def index_of_name(name: str, lines: Dict[str, List[int]], where: str) -> Optional[int]:
    """The class index of the folder `name` by the labels file (None when no line carries it); an EdgeError naming
    the lines when several do."""
    indices = lines.get(name) or []
    if len(indices) > 1:
        raise EdgeError("{}: folder '{}' is ambiguous: lines {} of the labels file all say it (class indices {}); "
                        "name the folder by its class index".format(
                            where, name, " and ".join(str(i + 1) for i in indices),
                            " and ".join(str(i) for i in indices)))
    return indices[0] if indices else None
