"""A family's configuration as one frozen record (the policy losses' `PolicyLossKnobs`, the advantage estimators'
`AdvantageKnobs`), read by name from config sections.

    PolicyLossKnobs.from_sections(config.actor.policy_loss, config.actor)   # the first section holding a name wins

A record's fields carry their config keys' names, so a new knob is a field of the record and a key of the same
name in the schema: nothing between them names it. Pure: a section is any dataclass.
"""

from dataclasses import dataclass, fields
from typing import TypeVar

K = TypeVar("K", bound="Knobs")


@dataclass(frozen=True)
class Knobs:
    """Base of a family's knob record (a frozen dataclass whose defaults are the reference system's)."""

    @classmethod
    def from_sections(cls: type[K], *sections: object) -> K:
        """The record read by field name from config sections (dataclasses), the first section holding a name
        winning; a field no section holds is a TypeError naming it."""
        values: dict[str, object] = {}
        names = {field.name for field in fields(cls)}
        for section in reversed(sections):
            values.update({field.name: getattr(section, field.name) for field in fields(section)
                           if field.name in names})
        missing = sorted(names - set(values))
        if missing:
            raise TypeError(f"{cls.__name__}: no config section holds {', '.join(missing)}")
        return cls(**values)
