"""Hypothesis strategies derived from the event models' own annotations.

Each field's strategy comes from its type and constraints (bounds, lengths, regex patterns,
`uniqueItems`), so a new field is covered without touching this file. Cross-field rules
(model validators) are met by the few hand-written strategies in `OVERRIDES`, or by filtering
when most generated payloads satisfy them anyway.
"""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

import annotated_types
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gfair.events import ProfileUpdated, TradeCleared

MAX_COLLECTION = 4
_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
_TIMEZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)


class _Constraints:
    def __init__(self) -> None:
        self.ge: float | None = None
        self.gt: float | None = None
        self.le: float | None = None
        self.lt: float | None = None
        self.min_len: int = 0
        self.max_len: int | None = None
        self.pattern: str | None = None
        self.unique = False

    def absorb(self, item: object) -> None:
        if isinstance(item, FieldInfo):
            for inner in item.metadata:
                self.absorb(inner)
            extra = item.json_schema_extra
            if isinstance(extra, dict):
                self.unique = self.unique or bool(extra.get("uniqueItems"))
                if isinstance(extra.get("pattern"), str):
                    self.pattern = self.pattern or str(extra["pattern"])
        elif isinstance(item, annotated_types.Ge):
            self.ge = float(item.ge)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Gt):
            self.gt = float(item.gt)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Le):
            self.le = float(item.le)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Lt):
            self.lt = float(item.lt)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.MinLen):
            self.min_len = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            self.max_len = item.max_length
        elif getattr(item, "pattern", None) is not None:
            self.pattern = str(item.pattern)  # type: ignore[attr-defined]


def _unwrap(annotation: Any, constraints: _Constraints) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        for extra in extras:
            constraints.absorb(extra)
        annotation = base
    return annotation


def _string(c: _Constraints) -> st.SearchStrategy[str]:
    if c.pattern is not None:
        anchored = c.pattern.endswith("$")
        strategy = st.from_regex(c.pattern, fullmatch=anchored, alphabet=_TEXT)
    else:
        strategy = st.text(_TEXT, min_size=max(c.min_len, 0), max_size=min(c.max_len or 24, 24))
    longest = c.max_len
    return strategy.filter(lambda s: c.min_len <= len(s) and (longest is None or len(s) <= longest))


def _number(annotation: type, c: _Constraints) -> st.SearchStrategy[Any]:
    if annotation is int:
        low = c.ge if c.ge is not None else (None if c.gt is None else c.gt + 1)
        high = c.le if c.le is not None else (None if c.lt is None else c.lt - 1)
        return st.integers(
            min_value=None if low is None else int(low),
            max_value=None if high is None else int(high),
        )
    return st.floats(
        min_value=c.ge if c.ge is not None else c.gt,
        max_value=c.le if c.le is not None else c.lt,
        exclude_min=c.gt is not None,
        exclude_max=c.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def for_annotation(
    annotation: Any, constraints: _Constraints | None = None
) -> st.SearchStrategy[Any]:
    c = constraints or _Constraints()
    annotation = _unwrap(annotation, c)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([for_annotation(arg, _copy(c)) for arg in args])
    if annotation is type(None):
        return st.none()
    if origin is typing.Literal:
        return st.sampled_from(args)
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _number(annotation, c)
    if annotation is str:
        return _string(c)
    if annotation in (datetime, AwareDatetime):
        return st.datetimes(timezones=_TIMEZONES)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return for_model(annotation)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        items = for_annotation(args[0])
        return st.lists(
            items,
            min_size=c.min_len,
            max_size=max(c.min_len, min(c.max_len or MAX_COLLECTION, MAX_COLLECTION)),
            unique=c.unique,
        ).map(tuple)
    if origin is dict:
        return st.dictionaries(
            for_annotation(args[0]),
            for_annotation(args[1]),
            min_size=c.min_len,
            max_size=max(c.min_len, MAX_COLLECTION),
        )
    raise NotImplementedError(f"no strategy for {annotation!r}")


def _copy(c: _Constraints) -> _Constraints:
    clone = _Constraints()
    clone.__dict__.update(c.__dict__)
    return clone


def _field(info: FieldInfo) -> st.SearchStrategy[Any]:
    c = _Constraints()
    c.absorb(info)
    return for_annotation(info.annotation, c)


def _build(model: type[BaseModel], values: dict[str, Any]) -> BaseModel | None:
    try:
        return model(**values)
    except ValidationError:
        return None


def for_model(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Valid instances of `model`: optional fields present or absent at random."""
    if model in OVERRIDES:
        return OVERRIDES[model]
    fields = model.model_fields.items()
    required = {name: _field(info) for name, info in fields if info.is_required()}
    optional = {name: _field(info) for name, info in fields if not info.is_required()}
    return (
        st.fixed_dictionaries(required, optional=optional)
        .map(lambda values: _build(model, values))
        .filter(lambda built: built is not None)
    )


_generation = st.from_regex(r"^[a-z0-9]{1,8}$", fullmatch=True)
_user = st.from_regex(r"^[A-Za-z0-9_-]{1,16}$", fullmatch=True)
_positive = st.floats(min_value=0.01, max_value=1e6, allow_nan=False)


@st.composite
def _profiles(draw: st.DrawFn) -> ProfileUpdated:
    rates = draw(st.dictionaries(_generation, st.floats(0, 1e6), min_size=1, max_size=4))
    known = sorted(rates)
    return ProfileUpdated(
        user=draw(_user),
        job_id=draw(st.none() | _user),
        rates=rates,
        baseline=draw(st.sampled_from(known)),
        speedups=draw(st.dictionaries(st.sampled_from(known), _positive, max_size=4)),
        observed=tuple(draw(st.lists(st.sampled_from(known), unique=True, max_size=4))),
    )


@st.composite
def _trades(draw: st.DrawFn) -> TradeCleared:
    buyer, seller = draw(st.lists(_user, min_size=2, max_size=2, unique=True))
    fast, slow = draw(st.lists(_generation, min_size=2, max_size=2, unique=True))
    low, high = sorted(draw(st.lists(_positive, min_size=2, max_size=2)))
    others = draw(st.dictionaries(_user, _positive, max_size=3))
    bids = {**others, buyer: high, seller: low}
    return TradeCleared(
        buyer=buyer,
        seller=seller,
        fast_pool=fast,
        slow_pool=slow,
        quantity=draw(_positive),
        price=draw(st.floats(min_value=low, max_value=high)),
        bids=bids,
    )


OVERRIDES: dict[type[BaseModel], st.SearchStrategy[Any]] = {
    ProfileUpdated: _profiles(),
    TradeCleared: _trades(),
}
