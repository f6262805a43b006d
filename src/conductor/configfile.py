"""The configuration wing: reading YAML files so that every mistake names its line.

Pool files (:mod:`conductor.pool`), benchmark files (:mod:`conductor.bench.spec`),
training configs (:mod:`conductor.train.config`) and chat templates
(:mod:`conductor.conductors.prompt`) are all read the same way: the text is composed
into a YAML node tree (:func:`compose_yaml`, which keeps line numbers and refuses trees
nested past :data:`MAX_YAML_DEPTH`), and a :class:`ConfigReader` subclass walks it,
checking each value and raising that file kind's
:class:`~conductor.errors.ConfigFileError` as ``FILE:LINE: message``.
"""

from __future__ import annotations

import datetime
import difflib
import json
import logging
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .bounds import Bound, shown_number
from .errors import ConfigFileError
from .redact import ENV_NAME_RE, MIN_SECRET_CHARS, SECRETS, looks_like_key, redact_url
from .text import printable
from .userfiles import UnreadableFileError, check_regular, read_text

__all__ = [
    "MAX_TIMEOUT_S",
    "HugeNumber",
    "MAX_YAML_DEPTH",
    "ConfigReader",
    "close_match",
    "compose_yaml",
    "did_you_mean",
    "key_list",
    "node_line",
    "read_config_file",
    "show_number",
    "show_value",
]

_VAR_RE = re.compile(r"\$\{([^}]*)\}")
log = logging.getLogger("conductor")
#: The largest number a setting may be (a price): beyond it is a mistake.
_LARGEST_NUMBER = 1e15
#: The longest timeout a setting may give, in seconds (a week): longer is no timeout,
#: and some waits refuse timeouts much longer (``threading``'s at about 292 years).
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: How deeply collections may nest in a pool, benchmark or training file; the readers
#: recurse, and no real file comes near this.
MAX_YAML_DEPTH = 64


def node_line(node: yaml.Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def show_value(value: Any) -> str:
    """How a bad value is quoted in an error message."""
    if isinstance(value, (yaml.SequenceNode, list)):
        return "a list"
    if isinstance(value, (yaml.MappingNode, dict)):
        return "a mapping"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def show_number(value: Any) -> str:
    """How a bad value of a numeric setting is quoted: an integer as
    :func:`~conductor.bounds.shown_number` names it (one of many digits by its length),
    anything else (``true``, a string, a list) as :func:`show_value`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return shown_number(value)
    return show_value(value)


def key_list(keys: tuple[str, ...]) -> str:
    """The allowed keys or values, as an error message lists them."""
    return ", ".join(keys)


def close_match(word: str, allowed: tuple[str, ...] | list[str]) -> str | None:
    """The one entry of ``allowed`` that ``word`` is most likely a misspelling of."""
    close = difflib.get_close_matches(word, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, allowed: tuple[str, ...] | list[str]) -> str:
    """``' (did you mean "x"?)'`` for a close entry of ``allowed``, else ``""``."""
    close = close_match(word, allowed)
    return f' (did you mean "{close}"?)' if close else ""


class ConfigReader:
    """Walks a composed YAML tree, checking each value and expanding ``${VAR}``.

    Working on nodes rather than on ``yaml.safe_load``'s output is what lets every
    error name the line it is about.  A kind of file subclasses it with its sections
    and sets :attr:`error_class`.
    """

    #: The class of the errors this reader raises (one per kind of file).
    error_class: type[ConfigFileError] = ConfigFileError
    #: Whether ``${NAME}`` in a value is an environment variable.  Files whose text
    #: uses ``${name}`` for their own placeholders (benchmark prompts, templates)
    #: turn this off, so that it reaches the template untouched.
    expands_variables: bool = True
    #: How messages name the kind of file (``"pool file"``).
    what: str = "configuration file"

    def __init__(self, source: str, environ: Mapping[str, str]) -> None:
        self.source = source
        self.environ = environ
        # Used only to build scalars and to resolve plain scalars after expansion.
        self.loader = yaml.SafeLoader("")
        self.flattened: dict[int, list[tuple[str, yaml.Node, yaml.Node]]] = {}

    def close(self) -> None:
        self.loader.dispose()

    def error(self, message: str, node: yaml.Node | None, field: str | None) -> ConfigFileError:
        return self.error_class(
            message,
            path=self.source,
            line=node_line(node) if node is not None else 1,
            field=field,
        )

    def document(
        self,
        root: yaml.Node | None,
        top_keys: tuple[str, ...],
        *,
        empty: str,
        shape: str = "a mapping",
        required: tuple[str, ...] = (),
    ) -> dict[str, yaml.Node]:
        """The top-level mapping of a file, key -> value node, with its keys checked:
        ``empty`` is the sentence for an empty file, ``shape`` what the top level must be."""
        if root is None:
            raise self.error(empty, None, None)
        if not isinstance(root, yaml.MappingNode):
            raise self.error(
                f"the top level must be {shape}, got {show_value(self.value(root, 'top level'))}",
                root,
                None,
            )
        keys = self.mapping(root, "", top_keys)
        get = {k: vn for k, (_kn, vn) in keys.items()}
        for key in required:
            if key not in get:
                raise self.error(f'missing required key "{key}"', root, key)
        return get

    # ---------------------------------------------------------------- raw values

    def expand(self, text: str, node: yaml.Node, field: str) -> str:
        """Replace ``${NAME}`` and ``${NAME:-default}`` in ``text``."""
        if "${" not in text:
            return text

        def substitute(match: re.Match[str]) -> str:
            inner = match.group(1)
            name, has_default, default = inner.partition(":-")
            if not ENV_NAME_RE.match(name):
                raise self.error(
                    f'{field} has a malformed variable reference "${{{inner}}}"; '
                    "write ${NAME} or ${NAME:-default}",
                    node,
                    field,
                )
            value = self.environ.get(name)
            if value:
                # Taken from the environment: a secret wherever it lands (a default
                # written in the file is not one).
                self.hold_secret(value, name, node, field)
            if has_default:
                # Shell semantics: an empty variable also takes the default.
                return value if value else default
            if value is None:
                raise self.error(
                    f"{field} uses ${{{name}}} but the environment variable {name} is not set "
                    f"(set it, or give a default with ${{{name}:-default}})",
                    node,
                    field,
                )
            return value

        if text.count("${") != len(_VAR_RE.findall(text)):
            raise self.error(
                f'{field} has an unclosed or nested variable reference in "{text}"; '
                "write ${NAME} or ${NAME:-default}",
                node,
                field,
            )
        return _VAR_RE.sub(substitute, text)

    def hold_secret(self, value: str, name: str, node: yaml.Node, field: str) -> None:
        """Have :data:`conductor.redact.SECRETS` mask ``value`` (taken from the variable
        ``name``) in everything written; one too short to mask is said once, unless it
        reads as a number or a truth value (a setting such as ``${MAX_TOKENS}``)."""
        if SECRETS.add(value):
            return
        tag = self.loader.resolve(  # type: ignore[no-untyped-call, unused-ignore]
            yaml.ScalarNode, value.strip(), (True, False)
        )
        where = f"{self.source}:{node_line(node)}: {field}"
        if tag == "tag:yaml.org,2002:str" and SECRETS.first_short(where):
            log.warning(
                "%s takes ${%s} from the environment, but its value is %d characters, "
                "too short to mask (%d or more) without masking every word it spells: "
                "it is written as it is (write it in the file if it is not a secret)",
                where,
                name,
                len(value),
                MIN_SECRET_CHARS,
            )

    def scalar(self, node: yaml.ScalarNode, field: str) -> Any:
        """The Python value of a scalar, after variable expansion (where on)."""
        value = self.construct(node, field)
        if self.expands_variables and isinstance(value, str) and "${" in value:
            expanded = self.expand(value, node, field)
            if node.style is None:
                # A plain (unquoted) scalar is typed by what it expands to, so that
                # `max_tokens: ${MAX_TOKENS:-4096}` gives an int and `${URL:-}` gives null.
                tag = self.loader.resolve(  # type: ignore[no-untyped-call, unused-ignore]
                    yaml.ScalarNode, expanded, (True, False)
                )
                return self.construct(yaml.ScalarNode(tag, expanded), field, node)
            return expanded
        return value

    def construct(self, node: yaml.ScalarNode, field: str, where: yaml.Node | None = None) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self.error(
                f"{field} has an invalid value: {exc.problem}", where or node, field
            ) from None
        except (ValueError, OverflowError) as exc:
            # PyYAML's constructors let these through: an integer of thousands of
            # digits (int() refuses to read it), a date such as 2024-13-45.
            digits = str(node.value).lstrip("+-").replace("_", "")
            if digits.isdigit():
                # Read as a number too large for any setting: each reader of a value
                # then refuses it with its own range ("must be an integer from 1 to
                # 1,000, got a number of 5,000 digits").
                return HugeNumber(len(digits))
            raise self.error(
                f"{field} has an invalid value {_scalar_shown(node)}: {_first_line(exc)}",
                where or node,
                field,
            ) from None
        if isinstance(value, (datetime.date, datetime.datetime)):
            # Keep params JSON-ready for records and cache keys.
            return value.isoformat()
        if isinstance(value, bytes):
            raise self.error(f"{field} must not be binary data", where or node, field)
        return value

    def plain(self, node: yaml.Node, field: str) -> Any:
        """Any value as plain Python (used for pass-through ``params``)."""
        if isinstance(node, yaml.ScalarNode):
            value = self.scalar(node, field)
            if isinstance(value, HugeNumber):  # passed on, nothing would check it
                raise self.error(f"{field} is {value}, larger than any value it takes", node, field)
            return value
        if isinstance(node, yaml.SequenceNode):
            return [self.plain(item, f"{field}[{i}]") for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.MappingNode)  # the only other kind of node
        out: dict[str, Any] = {}
        for key, _key_node, value_node in self.items(node, field):
            out[key] = self.plain(value_node, f"{field}.{key}")
        return out

    def items(self, node: yaml.MappingNode, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The (key, key node, value node) triples of a mapping; keys must be unique strings."""
        if id(node) in self.flattened:
            # An alias met again: already checked, and flattening changed its keys.
            return self.flattened[id(node)]
        seen: dict[str, yaml.Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.key_text(key_node, field)
            if key in seen:
                raise self.error(
                    f'{field or "top level"}: key "{key}" appears twice '
                    f"(lines {node_line(seen[key])} and {node_line(key_node)})",
                    key_node,
                    f"{field}.{key}" if field else key,
                )
            seen[key] = key_node
        try:
            # Applies YAML merge keys (`<<: *defaults`); explicit keys come after, so win.
            self.loader.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            raise self.error(
                f"{field or 'top level'} has a bad merge key: {exc.problem}", node, field
            ) from None
        result: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            result[self.key_text(key_node, field)] = (key_node, value_node)
        triples = [(k, kn, vn) for k, (kn, vn) in result.items()]
        self.flattened[id(node)] = triples
        return triples

    def key_text(self, key_node: yaml.Node, field: str) -> str:
        shown: Any = key_node
        if isinstance(key_node, yaml.ScalarNode):
            shown = self.construct(key_node, field)
            if isinstance(shown, str):
                return shown
        raise self.error(
            f"{field or 'top level'} has a key that is not a string: {show_value(shown)}",
            key_node,
            field,
        )

    def mapping(
        self, node: yaml.Node, field: str, allowed: tuple[str, ...], what: str = "a mapping"
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Check ``node`` is a mapping with only ``allowed`` keys; return them by name."""
        if not isinstance(node, yaml.MappingNode):
            shown = self.scalar(node, field) if isinstance(node, yaml.ScalarNode) else node
            raise self.error(f"{field} must be {what}, got {show_value(shown)}", node, field)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        where = field or "top level"
        for key, key_node, value_node in self.items(node, field):
            sub = f"{field}.{key}" if field else key
            if key == "api_key":
                raise self.error(
                    f"{where}: do not write an API key in a {self.what}; put the key in an "
                    "environment variable and name that variable with api_key_env "
                    "(e.g. api_key_env: OPENAI_API_KEY)",
                    key_node,
                    sub,
                )
            if key not in allowed:
                hint = did_you_mean(key, allowed) or f"; allowed keys: {key_list(allowed)}"
                raise self.error(f'{where}: unknown key "{key}"{hint}', key_node, sub)
            out[key] = (key_node, value_node)
        return out

    # ---------------------------------------------------------------- typed values

    def value(self, node: yaml.Node, field: str) -> Any:
        """A scalar value, or the node itself when it is a list or mapping."""
        return self.scalar(node, field) if isinstance(node, yaml.ScalarNode) else node

    def string(self, node: yaml.Node, field: str, *, empty_ok: bool = False) -> str | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(f"{field} must be a string, got {show_value(value)}", node, field)
        if not value and not empty_ok:
            return None
        return value

    def required_string(self, node: yaml.Node, field: str) -> str:
        value = self.value(node, field)
        if not isinstance(value, str) or not value.strip():
            raise self.error(
                f"{field} must be a non-empty string, got {show_value(value)}", node, field
            )
        return value

    def integer(self, node: yaml.Node, field: str, bound: Bound) -> int | None:
        """An integer within ``bound`` (every count a user gives has one: see
        :mod:`conductor.bounds`), or None for nothing."""
        value = self.value(node, field)
        if value is None:
            return None
        if value not in bound:
            shown = show_number(value)
            raise self.error(f"{field} must be {bound.describe()}, got {shown}", node, field)
        return int(value)

    def number(
        self,
        node: yaml.Node,
        field: str,
        *,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        value = self.value(node, field)
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        # Finite: NaN compares false with everything, infinity is no setting, and an
        # integer too large for a float cannot become one.
        ok = ok and abs(value) <= _LARGEST_NUMBER
        if ok and (value <= 0 if positive else value < 0):
            ok = False
        if ok and maximum is not None and value > maximum:
            ok = False
        if not ok:
            top = f"{maximum if maximum is not None else _LARGEST_NUMBER:g}"
            kind = f"a positive number up to {top}" if positive else f"a number between 0 and {top}"
            shown = show_number(value)
            raise self.error(f"{field} must be {kind}, got {shown}", node, field)
        return float(value)

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(f"{field} must be true or false, got {show_value(value)}", node, field)
        return value

    def choice(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> str | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, str) or value not in allowed:
            hint = did_you_mean(value, allowed) if isinstance(value, str) else ""
            raise self.error(
                f"{field} must be one of {key_list(allowed)}; got {show_value(value)}{hint}",
                node,
                field,
            )
        return value

    def required_choice(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> str:
        """One of ``allowed``, where nothing (null) is no answer either."""
        value = self.choice(node, field, allowed)
        if value is None:
            raise self.error(
                f"{field} must be one of {key_list(allowed)}; got nothing (null)", node, field
            )
        return value

    def url(self, node: yaml.Node, field: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None  # an empty string after expansion means "not set"
        value = value.strip()
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # The value may hold credentials from the environment: do not echo them.
            shown = redact_url(value) if ("@" in value or "?" in value) else value
            raise self.error(
                f"{field} must be an http(s) URL such as http://localhost:8000/v1, "
                f"got {show_value(shown)}",
                node,
                field,
            )
        return value

    def env_name(self, node: yaml.Node, field: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None
        if looks_like_key(value):
            raise self.error(
                f"{field} must name an environment variable (e.g. OPENAI_API_KEY), but its "
                "value looks like an API key itself; put the key in that variable instead",
                node,
                field,
            )
        if not ENV_NAME_RE.match(value):
            raise self.error(
                f"{field} must be an environment variable name such as OPENAI_API_KEY, "
                f"got {show_value(value)}",
                node,
                field,
            )
        return value

    def regular_file(self, path: Path, node: yaml.Node, field: str) -> Path:
        """``path`` (named by ``field``) when it is a regular file; anything else (none
        there, a FIFO, a device, a directory) is refused naming the line."""
        try:
            check_regular(path, "file")
        except UnreadableFileError as exc:
            where = printable(str(path))
            raise self.error(f"{field}: {exc.reason} ({where})", node, field) from None
        return path

    def params(self, node: yaml.Node, field: str) -> dict[str, Any]:
        value = self.value(node, field)
        if value is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{field} must be a mapping, got {show_value(value)}", node, field)
        result = self.plain(node, field)
        assert isinstance(result, dict)
        return result


class HugeNumber:
    """An integer written with more digits than ``int()`` reads (see
    :meth:`ConfigReader.construct`): it stands in the value's place so that the reader
    of that value refuses it as out of its range, naming it by its length."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __str__(self) -> str:
        return f"a number of {self.digits:,} digits"


def _scalar_shown(node: yaml.ScalarNode) -> str:
    text = str(node.value)
    if len(text) > 40:
        return f"of {len(text):,} characters"
    return json.dumps(text, ensure_ascii=False)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def read_config_file(path: Path, what: str, error_class: type[ConfigFileError]) -> str:
    """The text of a YAML file the user named (a regular file of at most
    :data:`~conductor.userfiles.MAX_CONFIG_BYTES`, UTF-8); each way reading fails is one
    sentence (``what`` names the kind of file, e.g. ``"pool file"``)."""
    try:
        return read_text(path, what)
    except UnreadableFileError as exc:
        raise error_class(exc.reason, path=str(path), line=exc.line) from None


def compose_yaml(text: str, source: str, error_class: type[ConfigFileError]) -> yaml.Node | None:
    """The YAML node tree of ``text`` (nodes keep their line numbers for messages)."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # PyYAML splits its message as "while doing X" (context), "found Y" (problem).
        problem = exc.problem or "could not be parsed"
        context = f"{exc.context}, " if exc.context else ""
        raise error_class(
            f"invalid YAML: {context}{problem}",
            path=source,
            line=(mark.line + 1) if mark is not None else None,
        ) from None
    except yaml.reader.ReaderError as exc:
        # A character YAML does not allow (NUL, most control characters): named with
        # its line, in one sentence (the error's own text spans two lines).
        line = text.count("\n", 0, exc.position) + 1
        raise error_class(
            f"invalid YAML: the character {exc.character!r} is not allowed in YAML text",
            path=source,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise error_class(f"invalid YAML: {_first_line(exc)}", path=source) from None
    except RecursionError:
        # PyYAML composes nested collections recursively.
        raise error_class(
            f"invalid YAML: collections are nested too deeply (at most {MAX_YAML_DEPTH} "
            "levels are read)",
            path=source,
        ) from None
    _check_depth(node, source, error_class)
    return node


def _check_depth(root: yaml.Node | None, source: str, error_class: type[ConfigFileError]) -> None:
    """Refuse trees deeper than :data:`MAX_YAML_DEPTH` before any recursive reader sees
    them (an explicit stack: the check itself must not recurse)."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)] if root is not None else []
    # Deepest level each node was walked at: an alias reached deeper is walked again.
    seen: dict[int, int] = {}
    while stack:
        node, depth = stack.pop()
        if depth > MAX_YAML_DEPTH:
            raise error_class(
                f"invalid YAML: collections are nested more than {MAX_YAML_DEPTH} levels deep",
                path=source,
                line=node_line(node),
            )
        if seen.get(id(node), 0) >= depth:
            continue
        seen[id(node)] = depth
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
