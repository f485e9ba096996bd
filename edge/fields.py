"""A config field declared once (type, default, range, choices, help, reload policy, flag) and what is derived
from the declarations: validation, argparse flags, the documented example YAML and what a SIGHUP applies.

Declarations live in edge/config.py as dataclass fields made by `setting()` and `section()` (stdlib
`dataclasses.field(metadata=...)`, Python 3.8); this module walks them. A command's own options (`edge check
--frames`) are declared the same way, one flat dataclass per command: argparse, the bounds check and any caller
building the options in code read that one declaration.
"""

import argparse
import dataclasses
import json
import math
import reprlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from edge.errors import EdgeError

# What a SIGHUP does with a changed field (a section's policy is inherited by its fields).
APPLY = "apply"  # the running daemon takes it
RESTART = "restart"  # kept until a restart; the reload line names it
OFFLINE = "offline"  # not read by the daemon (the build chain's keys)


def setting(default: Any, help: str, choices: Sequence[Any] = (), low: Optional[float] = None,
            high: Optional[float] = None, length: int = 0, reload: Optional[str] = None, flag: Optional[str] = None,
            check: Optional[Callable[[Any, str], Any]] = None, metavar: str = "") -> Any:
    """One config key. `low`/`high`: inclusive range (of every item of a list); `length`: a list's length;
    `flag`: the command-line flag that overrides it; `check(value, name)`: a parser that raises EdgeError;
    `metavar`: the flag's value in --help (default: the key's name in capitals)."""
    meta = {"help": help, "choices": tuple(choices), "range": None if low is None else (low, high),
            "length": length, "flag": flag, "check": check, "metavar": metavar}
    if reload is not None:
        meta["reload"] = reload
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: Any, reload: Optional[str] = None) -> Any:
    return dataclasses.field(default_factory=cls, metadata={} if reload is None else {"reload": reload})


def leaves(cls: Any, prefix: str = "", reload: str = RESTART) -> Iterator[Tuple[str, Any, str]]:
    """(dotted key, dataclasses.Field, reload policy) of every key under `cls`, in declaration order."""
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata and not dataclasses.is_dataclass(f.type):
            continue  # not a YAML key (Config.path)
        policy = f.metadata.get("reload", reload)
        if dataclasses.is_dataclass(f.type):
            yield from leaves(f.type, prefix + f.name + ".", policy)
        else:
            yield prefix + f.name, f, policy


def declared_range(cls: Any, dotted: str) -> Tuple[Any, Any]:
    """The (low, high) declared for key `dotted` of `cls`: an option that sets the key takes the key's bounds."""
    return next(f for key, f, _ in leaves(cls) if key == dotted).metadata["range"]


def lookup(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# -- validation --------------------------------------------------------------------------------------------
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 50, 50
_REPR.maxlong = 30


def show(value: Any) -> str:
    """A value for an error line: bounded however large or deeply nested (an alias bomb) it is."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, where: str, key: str) -> Any:
    """`value` as type `tp` (bool is no number, an int is a float), or an EdgeError naming `key`."""
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where, key)
    if getattr(tp, "__origin__", None) in (list, List):
        (item_tp,) = tp.__args__
        if not isinstance(value, list):
            raise EdgeError("{}: '{}' must be a list, got {}".format(where, key, show(value)))
        return [coerce(v, item_tp, where, "{}[{}]".format(key, i)) for i, v in enumerate(value)]
    ok = (
        isinstance(value, bool) if tp is bool
        else isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
        else isinstance(value, int) and not isinstance(value, bool) if tp is int
        else isinstance(value, tp)
    )
    if not ok:
        raise EdgeError("{}: '{}' must be {}, got {}".format(where, key, _type_name(tp), show(value)))
    if tp is float:
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise EdgeError("{}: '{}' must be a finite number, got {}".format(where, key, show(value)))
    if tp is str and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise EdgeError("{}: '{}' must not contain control characters, got {}".format(where, key, show(value)))
    return value


def build(cls: Any, data: Any, where: str, prefix: str = "") -> Any:
    """A `cls` instance from a mapping: unknown keys and wrong types are one EdgeError naming the dotted key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise EdgeError("{}: '{}' must be a mapping, got {}".format(where, prefix or "<top level>", show(data)))
    fields = {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata or dataclasses.is_dataclass(f.type)}
    values = {}
    for key, value in data.items():
        dotted = prefix + "." + str(key)[:60] if prefix else str(key)[:60]
        if key not in fields:
            raise EdgeError("{}: unknown key '{}' (expected one of: {})".format(where, dotted, ", ".join(fields)))
        values[key] = coerce(spelled(value, fields[key]), fields[key].type, where, dotted)
    return cls(**values)


def spelled(value: Any, f: Any) -> Any:
    """The choice a YAML boolean spells: YAML 1.1 reads `off`/`no` as false and `on`/`yes` as true, so
    `batching.policy: off` arrives as False; where a text field's choices have the word, it is that word."""
    if isinstance(value, bool) and f.type is str:
        for word in ("on", "yes") if value else ("off", "no"):
            if word in f.metadata.get("choices", ()):
                return word
    return value


def validate(obj: Any, where: str, prefix: str = "") -> None:
    """Every declared choice, range, length and check of `obj` (a Config or one of its sections)."""
    for dotted, f, _ in leaves(type(obj)):
        check_value(lookup(obj, dotted), f, "{}: '{}'".format(where, prefix + dotted))


def check_value(value: Any, f: Any, label: str) -> None:
    """`value` against field `f`'s declared choices, range, length and check; EdgeError "<label> must ..."."""
    meta = f.metadata
    if meta["choices"] and value not in meta["choices"]:
        raise EdgeError("{} must be one of {}, got {}".format(label, "|".join(meta["choices"]), show(value)))
    items = value if isinstance(value, list) else [value]
    if meta["length"] and len(items) != meta["length"]:
        raise EdgeError("{} must list {} numbers, got {}".format(label, meta["length"], show(value)))
    if meta["range"] is not None and not all(meta["range"][0] <= v <= meta["range"][1] for v in items):
        raise EdgeError("{} must be between {} and {}, got {}".format(label, *meta["range"], show(value)))
    if meta["check"] is not None:
        meta["check"](value, label)


# -- derived: reload policy, flags, example -----------------------------------------------------------------
def reloaded(running: Any, new: Any) -> Tuple[Any, List[str]]:
    """`running` with every APPLY key taken from `new`, and the RESTART keys that differ (a restart applies them)."""
    applied: Dict[str, Any] = {}
    restart = []
    for dotted, _, policy in leaves(type(running)):
        if lookup(running, dotted) == lookup(new, dotted):
            continue
        if policy == APPLY:
            applied[dotted] = lookup(new, dotted)
        elif policy == RESTART:
            restart.append(dotted)
    return replace_keys(running, applied), restart


def replace_keys(obj: Any, values: Dict[str, Any]) -> Any:
    """A copy of the dataclass `obj` with dotted keys replaced."""
    here: Dict[str, Any] = {}
    nested: Dict[str, Dict[str, Any]] = {}
    for dotted, value in values.items():
        head, _, rest = dotted.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            here[head] = value
    here.update({head: replace_keys(getattr(obj, head), sub) for head, sub in nested.items()})
    return dataclasses.replace(obj, **here)


def add_flags(parser: Any, cls: Any, *keys: str) -> None:
    """The declared flag of each dotted key (type, choices and help from its declaration); dest is the key.
    A list of numbers is spelled comma-separated (`--batch 1,2,4`), a list of texts by repeating the flag; a
    true-or-false option is a switch.
    `parser`: an ArgumentParser or one of its argument groups."""
    declared = {dotted: f for dotted, f, _ in leaves(cls)}
    for dotted in keys:
        f = declared[dotted]
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore
        text = "{} (default {})".format(meta["help"], _flag_value(default))
        text = ("{}: {}".format(dotted, text) if _config_key(dotted) else text).replace("%", "%%")
        if f.type is bool:
            parser.add_argument(meta["flag"], dest=dotted, action="store_true", default=None,
                                help=meta["help"].replace("%", "%%"))
            continue
        item = f.type.__args__[0] if getattr(f.type, "__origin__", None) in (list, List) else None
        if item is str:  # a list of texts is a repeated flag
            parser.add_argument(meta["flag"], dest=dotted, action="append", metavar=meta["metavar"] or None,
                                help=meta["help"].replace("%", "%%"))
            continue
        parser.add_argument(meta["flag"], dest=dotted, type=_comma_list(item) if item else f.type,
                            choices=meta["choices"] or None,
                            metavar=None if meta["choices"] else meta["metavar"] or dotted.rsplit(".", 1)[-1].upper(),
                            help=text)


def _comma_list(item: Any) -> Callable[[str], List[Any]]:
    def parse(text: str) -> List[Any]:
        try:
            return sorted({item(v) for v in text.split(",") if v.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError("a comma-separated list of numbers, e.g. 1,2,4") from None
    return parse


def _flag_value(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else _yaml_value(value)


def flag_values(args: argparse.Namespace, cls: Any) -> Dict[str, Any]:
    """{dotted key: value} of the declared flags given on the command line, each checked against its declaration
    (the error names the flag)."""
    declared = {dotted: f for dotted, f, _ in leaves(cls)}
    given = {k: v for k, v in vars(args).items() if k in declared and v is not None}
    for dotted, value in given.items():
        f = declared[dotted]
        if _config_key(dotted):  # read as the file's value is: a finite number, a text without control characters
            value = given[dotted] = coerce(value, f.type, f.metadata["flag"], dotted)
        check_value(value, f, _flag_label(dotted, f))
    return given


# -- command options: a flat dataclass of `setting(..., flag=...)` fields, one per command ----------------------
def options_from(args: argparse.Namespace, cls: Any) -> Any:
    """The command options `cls` from the command line: a flag not given takes its declared default."""
    options = cls(**flag_values(args, cls))
    check_options(options)
    return options


def check_options(options: Any) -> None:
    """Every option of `options` within its declaration: one EdgeError naming the flag."""
    for dotted, f, _ in leaves(type(options)):
        check_value(lookup(options, dotted), f, _flag_label(dotted, f))


def as_argv(options: Any) -> List[str]:
    """The flags that give every option of `options` its value (what `options_from` reads back)."""
    argv: List[str] = []
    for dotted, f, _ in leaves(type(options)):
        value = lookup(options, dotted)
        if f.type is bool:
            argv += [f.metadata["flag"]] if value else []
        elif isinstance(value, list) and f.type.__args__[0] is str:
            argv += [text for item in value for text in (f.metadata["flag"], item)]
        else:
            argv += [f.metadata["flag"], _flag_value(value) if isinstance(value, list) else str(value)]
    return argv


def _config_key(dotted: str) -> bool:
    return "." in dotted  # a config key is sectioned (runtime.frames); a command option is not


def _flag_label(dotted: str, f: Any) -> str:
    """A flag's value in an error line: the flag, and a config key beside it (the YAML spells it so)."""
    return "{}: '{}'".format(f.metadata["flag"], dotted) if _config_key(dotted) else f.metadata["flag"]


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, str):
        plain = value and all(c.isalnum() or c in "/._-" for c in value) and value not in ("true", "false", "null")
        return value if plain else json.dumps(value)
    return repr(value)


def example(cls: Any, header: str) -> str:
    """The documented YAML: every key with its default and help, in declaration order."""
    lines, section_path = [header], []  # type: List[str], List[str]
    for dotted, f, policy in leaves(cls):
        parts = dotted.split(".")
        common = 0
        while common < min(len(section_path), len(parts) - 1) and section_path[common] == parts[common]:
            common += 1
        for depth in range(common, len(parts) - 1):
            lines += ([""] if depth == 0 else []) + ["{}{}:".format("  " * depth, parts[depth])]
        section_path = parts[:-1]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        entry = "{}{}: {}".format("  " * (len(parts) - 1), parts[-1], _yaml_value(default))
        choices = " | ".join(f.metadata["choices"])
        note = (choices + "; " if choices else "") + f.metadata["help"] + (" (SIGHUP applies)" if policy == APPLY
                                                                          else "")
        lines.append("{:<29} # {}".format(entry, note))
    return "\n".join(lines) + "\n"
