"""Several views of one sample (DINO's global and local crops, SimCLR's two
views): groups of views, each group one output size and one tensor, each
view its own ``Augment``.

``views_from_torchvision`` reads the recipes as they are written: a mapping
from a group's name to its views, a list of transforms (one view each, as
DINO's two global crops differ in blur and solarize) or ``(transform,
count)`` (count views of one transform, as DINO's local crops)::

    views = shardfeed.views_from_torchvision(
        {"global": [global_1, global_2], "local": (local, 8)}
    )

The bounds are the sidecar's (``src/decode/augment/views.rs``): at most 8
groups, 1 to 32 views a group, one size a group, 48 MiB of outputs a
sample; what is past them is a ``ValueError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._augment import Augment
from ._proto import shardfeed_pb2 as pb
from ._torchvision import from_torchvision

MAX_VIEW_GROUPS = 8
MAX_VIEWS_PER_GROUP = 32
MAX_VIEW_BYTES_PER_SAMPLE = 16 * 1024 * 1024 * 3


@dataclass(frozen=True)
class ViewGroup:
    """One group: its views' ``Augment``s, one output size, delivered as one
    ``[batch × views, height, width, 3]`` array."""

    name: str
    views: tuple[Augment, ...]

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` of every view of the group."""
        size = self.views[0].size
        assert size is not None  # checked when the group was made
        return size

    @property
    def count(self) -> int:
        return len(self.views)


@dataclass(frozen=True)
class Views:
    """A sample's view groups, in order (the order keys each view's draws)."""

    groups: tuple[ViewGroup, ...]

    def __post_init__(self) -> None:
        _check(self.groups)

    @property
    def count(self) -> int:
        """Views per sample, all groups."""
        return sum(group.count for group in self.groups)

    def bytes_per_sample(self) -> int:
        """Output bytes of one sample's views (uint8 RGB)."""
        return _bytes(self.groups)

    def to_messages(self) -> list[Any]:
        """The request's ``ViewGroup``s: a group of one view repeated is
        sent once with its count."""
        messages = []
        for group in self.groups:
            height, width = group.size
            augmentations = [view.to_message() for view in group.views]
            alike = all(a == augmentations[0] for a in augmentations[1:])
            messages.append(
                pb.ViewGroup(
                    height=height,
                    width=width,
                    views=augmentations[:1] if alike else augmentations,
                    count=group.count,
                )
            )
        return messages


def views(groups: Mapping[str, Sequence[Augment] | tuple[Augment, int] | Augment]) -> Views:
    """``Views`` of ``Augment``s: each group a list of them (one view each),
    ``(augment, count)``, or one ``Augment`` (one view)."""
    return Views(tuple(ViewGroup(name, _expanded(name, given)) for name, given in groups.items()))


def views_from_torchvision(groups: Mapping[str, Any]) -> Views:
    """``Views`` of torchvision (or timm) transforms, each converted by
    ``from_torchvision`` (so each is served with its own semantics, or
    refused naming what is not): a group is a list of transforms (one view
    each), ``(transform, count)``, or one transform."""
    converted: dict[str, tuple[Augment, ...]] = {}
    for name, given in groups.items():
        transforms = _expanded(name, given)
        converted[name] = tuple(from_torchvision(t) for t in transforms)
    return views(converted)


def refuse_conflicts(views: Any, conflicts: dict[str, bool], why: str) -> None:
    """A stream of ``views`` asked with what it cannot be, refused naming
    the first conflicting argument (``conflicts``: name -> whether set)."""
    if not isinstance(views, Views):
        raise ValueError(
            f"views: a shardfeed Views (shardfeed.views or views_from_torchvision), not "
            f"{type(views).__name__}"
        )
    for name, conflicting in conflicts.items():
        if conflicting:
            raise ValueError(f"{name} is set with views: {why}; leave {name} unset")


def _expanded(name: str, given: Any) -> tuple[Any, ...]:
    """A group's views as given: a list, ``(view, count)``, or one view."""
    if isinstance(given, tuple) and len(given) == 2 and isinstance(given[1], int):
        view, count = given
        if isinstance(count, bool) or not 1 <= count <= MAX_VIEWS_PER_GROUP:
            raise ValueError(
                f"views[{name!r}].count: {count!r}; each group takes 1 to "
                f"{MAX_VIEWS_PER_GROUP} views"
            )
        return tuple(view for _ in range(count))
    if isinstance(given, (list, tuple)):
        return tuple(given)
    return (given,)


def _check(groups: tuple[ViewGroup, ...]) -> None:
    if not groups:
        raise ValueError("views: no groups; ask at least one group of at least one view")
    if len(groups) > MAX_VIEW_GROUPS:
        raise ValueError(f"views: {len(groups)} groups; at most {MAX_VIEW_GROUPS} are served")
    for group in groups:
        field = f"views[{group.name!r}]"
        if not 1 <= group.count <= MAX_VIEWS_PER_GROUP:
            raise ValueError(
                f"{field}.count: {group.count} views; each group takes 1 to {MAX_VIEWS_PER_GROUP}"
            )
        first = group.views[0]
        if first.size is None:
            raise ValueError(
                f"{field}.size: its first view names no output size; a view's crop "
                "(RandomResizedCrop(size) or Resize + CenterCrop) sets it"
            )
        for i, view in enumerate(group.views):
            if view.size != first.size:
                raise ValueError(
                    f"{field}.size: view {i} is {view.size}, view 0 {first.size}; a "
                    "group is one array, so its views share one size (put other sizes "
                    "in a group of their own)"
                )
            for what in ("normalize", "dtype", "to_unit_range", "layout"):
                if getattr(view, what) != getattr(first, what):
                    raise ValueError(
                        f"{field}: view {i}'s {what} differs from view 0's; a group is "
                        "one tensor, made one way"
                    )
    total = _bytes(groups)
    if total > MAX_VIEW_BYTES_PER_SAMPLE:
        raise ValueError(
            f"views: a sample's views hold {total} bytes; at most "
            f"{MAX_VIEW_BYTES_PER_SAMPLE} are served (fewer or smaller views)"
        )


def _bytes(groups: tuple[ViewGroup, ...]) -> int:
    return sum(h * w * 3 * group.count for group in groups for h, w in [group.size])
