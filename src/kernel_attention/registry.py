"""One vocabulary for the Python API, configs and the CLI.

Every swappable part of attention (kernel, positional scheme, set filter, backend, ...) is registered
here once, under a name, with typed parameters.  A part can then be asked for in any of these forms

    "poly"                          a bare name, default parameters
    "poly:degree=3"                 name and parameters in one string (what the CLI and configs use)
    {"name": "poly", "degree": 3}   a mapping (what YAML configs give)
    ("poly", {"degree": 3})         a pair
    an instance                     passed through unchanged

and an unknown name or a bad parameter fails *before any work is done*, with a message that lists what
is accepted.  Filters also compose in the string form: ``"causal&local:window=8"`` (intersection) and
``"a|b"`` (union) -- see :mod:`kernel_attention.filters`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import textwrap
from typing import Any, Callable, Iterable, Mapping

__all__ = ["Param", "Entry", "Registry", "parse_spec", "SpecError"]


class SpecError(ValueError):
    """A name or parameter that the registry does not accept."""


_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Param:
    """A typed, validated parameter of a registered part.

    ``type`` is one of ``int``, ``float``, ``bool``, ``str`` (or a tuple of them for unions);
    ``choices`` restricts a value to a set; ``check`` is a predicate with ``rule`` its human wording.
    ``default=_MISSING`` makes the parameter required; ``optional=True`` also admits ``None``.
    """

    name: str
    type: type | tuple[type, ...]
    default: Any = _MISSING
    doc: str = ""
    choices: tuple | None = None
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    optional: bool = False

    def __post_init__(self):
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(f"Param {self.name!r}: the type comes second, a type such as float or a tuple of types, "
                            f"got {self.type!r} (Param(name, type, default))")

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def describe(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        t = "|".join(x.__name__ for x in types)
        if self.optional:
            t += "|None"
        s = f"{self.name}: {t}"
        if self.choices:
            s += " in {" + ", ".join(map(str, self.choices)) + "}"
        if self.rule:
            s += f" ({self.rule})"
        if not self.required:
            s += f" = {self.default!r}"
        return s

    def _in_errors(self) -> str:
        """:meth:`describe` with the default said as such (``= 2`` reads as the value given)."""
        if self.required:
            return self.describe()
        return f"{self.describe().rsplit(' = ', 1)[0]}; default {self.default!r}"

    def coerce(self, value: Any, where: str) -> Any:
        if value is None and self.optional:
            return None
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, str) and (str not in types or bool in types and value.strip().lower() in _BOOL_WORDS):
            value = _from_string(value, types, f"{where}: parameter {self._in_errors()}")
        if bool not in types and isinstance(value, bool):
            raise SpecError(f"{where}: parameter {self._in_errors()} got a boolean {value!r}")
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, types):
            raise SpecError(f"{where}: parameter {self._in_errors()} got {value!r} of type {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):  # no part has a use for inf or nan
            raise SpecError(f"{where}: parameter {self.name}={value!r} must be a finite number")
        if self.choices is not None and value not in self.choices:
            raise SpecError(f"{where}: parameter {self.name}={value!r} is not one of {list(self.choices)}")
        if self.check is not None and not self.check(value):
            raise SpecError(f"{where}: parameter {self.name}={value!r} must satisfy: {self.rule}")
        return value


_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0", "on", "off")


def _from_string(text: str, types: tuple[type, ...], where: str) -> Any:
    low = text.strip().lower()
    if bool in types and low in _BOOL_WORDS:
        return low in ("true", "yes", "1", "on")
    for t in (int, float):
        if t in types:
            try:
                return t(text)
            except ValueError:
                pass
    raise SpecError(f"{where}: cannot read {text!r}")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]
    params: tuple[Param, ...]
    doc: str

    def signature(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}(" + ", ".join(p.describe() for p in self.params) + ")"


def spec_string(name: str, params: Mapping[str, Any]) -> str:
    """``name:key=value,...``, the string form of a spec (:func:`parse_spec` reads it back); parameters that
    are None are left out, booleans written ``true`` / ``false``."""
    text = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items() if v is not None]
    return f"{name}:" + ",".join(text) if text else name


def _where(factory: Callable) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


def _origin(factory: Callable) -> tuple[str, str]:
    """The file and qualified name of a class or function: one file imported under two module names (by its
    path and by its name) defines the same class."""
    module = getattr(factory, "__module__", "?")
    return getattr(sys.modules.get(module), "__file__", None) or module, getattr(factory, "__qualname__", "")


def _accepted(factory: Callable, context: dict) -> dict:
    """The subset of ``context`` that ``factory`` accepts by name (all of it for ``**kwargs``)."""
    if not context:
        return {}
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return context
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return context
    return {k: v for k, v in context.items() if k in sig.parameters}


def _summary(docstring: str | None) -> str:
    """The first paragraph of a docstring on one line: the whole first sentence or more, never its first
    physical line alone (which stops wherever the source wrapped, mid-sentence)."""
    paragraphs = [q for q in (docstring or "").strip().split("\n\n") if q.strip()] or [""]
    text = " ".join(paragraphs[0].split())
    for more in paragraphs[1:]:  # "... one factor per feature axis:" goes on with what it announces
        if not text.endswith(":"):
            break
        text += " " + " ".join(more.split())
    return text


def parse_spec(spec: Any) -> tuple[str, dict]:
    """Split a spec (string, mapping or pair) into ``(name, params)``; values stay as given."""
    if isinstance(spec, str):
        name, _, rest = spec.strip().partition(":")
        params: dict[str, Any] = {}
        if rest.strip():
            for item in rest.split(","):
                key, eq, value = item.partition("=")
                if not eq or not key.strip():
                    raise SpecError(f"cannot read parameter {item!r} in {spec!r}; write name:key=value,key=value")
                if key.strip() in params:
                    raise SpecError(f"parameter {key.strip()!r} is given twice in {spec!r}")
                params[key.strip()] = value.strip()
        return name.strip(), params
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise SpecError(f"a mapping spec needs a 'name' key, got keys {sorted(spec)}")
        params = dict(spec)
        return str(params.pop("name")), params
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], Mapping):
        return spec[0], dict(spec[1])
    raise SpecError(f"cannot read spec {spec!r}: give a name, 'name:key=value', a mapping with 'name', or a pair")


class Registry:
    """Named, typed constructors for one kind of part (e.g. kernels)."""

    def __init__(self, kind: str, base: type | None = None):
        self.kind = kind
        self.base = base
        self._entries: dict[str, Entry] = {}

    # -- registration -------------------------------------------------------------------------
    def register(self, name: str, params: Iterable[Param] = (), doc: str = "") -> Callable:
        """Decorator: ``@KERNELS.register("rbf", [Param("scale", float, None, optional=True)])``."""

        def wrap(factory: Callable) -> Callable:
            if self.base is not None and isinstance(factory, type) and not issubclass(factory, self.base):
                raise TypeError(f"{self.kind} {name!r}: {factory.__name__} is no subclass of {self.base.__name__}")
            old = self._entries.get(name)
            if old is not None and _origin(old.factory) != _origin(factory):  # the same class again: a re-import
                raise ValueError(f"{self.kind} {name!r} is registered twice ({_where(old.factory)} and "
                                 f"{_where(factory)})")
            text = doc or _summary(factory.__doc__)
            self._entries[name] = Entry(name, factory, tuple(params), text)
            return factory

        return wrap

    # -- look-up --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise SpecError(f"unknown {self.kind} {name!r}; accepted: {', '.join(self.names())}") from None

    def validate(self, spec: Any) -> tuple[str, dict]:
        """Return ``(name, params)`` with every parameter typed and checked, defaults filled in."""
        name, given = parse_spec(spec)
        entry = self.entry(name)
        where = f"{self.kind} {name!r}"
        known = {p.name: p for p in entry.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            accepted = ", ".join(p.describe() for p in entry.params) or "none"
            raise SpecError(f"{where} has no parameter {', '.join(unknown)}; accepted: {accepted}")
        out = {}
        for p in entry.params:
            if p.name in given:
                out[p.name] = p.coerce(given[p.name], where)
            elif p.required:
                raise SpecError(f"{where} needs parameter {p.describe()}")
            else:
                out[p.name] = p.default
        return name, out

    def with_params(self, spec: Any, given: Mapping[str, Any], context: Iterable[str] = ()) -> tuple[Any, dict]:
        """``(spec, rest)``: ``spec`` with the keyword arguments ``given`` that name its entry's parameters added
        (``make_kernel("rbf", scale=0.3)`` is ``"rbf:scale=0.3"``), and the others, each one of the ``context``
        names.  A parameter given twice, or a keyword that is neither, fails naming what is accepted."""
        if not given:
            return spec, {}
        name, params = parse_spec(spec)
        entry = self.entry(name)
        known = {p.name for p in entry.params}
        context = tuple(context)
        unknown = sorted(set(given) - known - set(context))
        if unknown:
            accepted = ", ".join(p.describe() for p in entry.params) or "none"
            raise SpecError(f"{self.kind} {name!r} has no parameter {', '.join(unknown)}; accepted: {accepted}"
                            + (f" (and {', '.join(context)}, the sizes of the layer)" if context else ""))
        twice = sorted(set(given) & known & set(params))
        if twice:
            raise SpecError(f"{self.kind} {name!r}: {', '.join(twice)} is given in the spec and as a keyword; give "
                            f"it once")
        mine = {k: v for k, v in given.items() if k in known}
        if not mine:
            return spec, dict(given)
        return {"name": name, **params, **mine}, {k: v for k, v in given.items() if k not in known}

    def create(self, spec: Any, **context: Any) -> Any:
        """Build a part from a spec.  ``context`` holds sizes the caller knows and the user does not
        choose (``d_model``, ``n_heads``, ``d_head``, ...); each factory receives only the context
        arguments its signature names, so stateless parts need not accept them."""
        if self.base is not None and isinstance(spec, self.base):
            return spec
        name, params = self.validate(spec)
        factory = self._entries[name].factory
        made = factory(**_accepted(factory, context), **params)
        if self.base is not None and not isinstance(made, self.base):
            raise TypeError(f"{self.kind} {name!r}: its factory gave a {type(made).__name__}, not a "
                            f"{self.base.__name__}")
        return made

    def describe(self) -> str:
        lines = [f"{self.kind}s:"]
        for name in self.names():
            e = self._entries[name]
            lines.append(f"  {e.signature()}")
            if e.doc:  # wrapped here: the --help formatters that keep our layout do not wrap it
                lines.append(textwrap.fill(e.doc, width=100, initial_indent="      ", subsequent_indent="      "))
        return "\n".join(lines)
